// Structured output through the official `openai` npm client (tests/server/openai_structured.mjs)
// against a real `crescent serve` on the random-weight tiny model: 50 sampled json_schema
// answers must stop by themselves, parse and validate with ajv (an independent validator),
// and json_object answers must be objects.

#include <gtest/gtest.h>

#include <string>

#include "server/serve_process.h"
#include "testing/node_script.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

TEST(OpenAiStructuredNodeTest, FiftySampledAnswersParseAndValidate) {
  require_node_and_openai();
  ServeProcess server({"--model", ensure_test_model("tiny"), "--threads", "1", "--max-model-len",
                       "512", "--kv-cache-mb", "16", "--served-model-name", "tiny"});
  std::string out;
  EXPECT_TRUE(run_node_script("tests/server/openai_structured.mjs",
                              {"http://127.0.0.1:" + std::to_string(server.port()) + "/v1", "tiny"},
                              "openai structured: ok", &out))
      << out;
}

}  // namespace
}  // namespace crescent::testing
