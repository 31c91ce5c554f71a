// Tool calling through the official `openai` npm client (tests/server/openai_tools.mjs):
// - against the server module on a fake engine that scripts a hermes reply, because a
//   random-weight model cannot be made to write a tool call: the calls must reach the client
//   as tool_calls, whole and streamed;
// - against a real `crescent serve` on the tiny model, with and without
//   --enable-auto-tool-choice --tool-call-parser hermes: the flags' wiring and the 400.

#include <gtest/gtest.h>

#include <string>

#include "server/fake_engine_client.h"
#include "server/openai_server.h"
#include "server/serve_process.h"
#include "testing/node_script.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

// Runs the script against BASE_URL; its output, and whether it passed.
bool run_node(const std::string& base_url, const std::string& model, const std::string& mode,
              std::string* out) {
  return run_node_script("tests/server/openai_tools.mjs", {base_url, model, mode},
                         "openai tools: ok", out);
}

TEST(OpenAiToolsNodeTest, ScriptedHermesCallsReachTheClient) {
  require_node_and_openai();
  server::OpenAiServerOptions options;
  options.served_model_name = "fake";
  options.enable_auto_tool_choice = true;
  options.tool_call_parser = "hermes";
  auto server = server::OpenAiServer::start(options);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  server::FakeEngineClient::Options fake;
  fake.max_model_len = 1024;
  fake.scripted_replies = {
      {"weather",
       {"Let", " me", " check.\n<tool", "_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}", "\n</tool_call>",
        "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"}}};
  server::FakeEngineClient engine(fake);
  (*server)->set_engine(&engine);
  std::string out;
  EXPECT_TRUE(run_node("http://127.0.0.1:" + std::to_string((*server)->port()) + "/v1", "fake",
                       "scripted", &out))
      << out;
  (*server)->stop();
}

std::vector<std::string> serve_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model",
                                   ensure_test_model("tiny"),
                                   "--threads",
                                   "1",
                                   "--max-model-len",
                                   "512",
                                   "--kv-cache-mb",
                                   "16",
                                   "--served-model-name",
                                   "tiny"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(OpenAiToolsNodeTest, RealServeWithAndWithoutTheFlags) {
  require_node_and_openai();
  {
    ServeProcess server(serve_args({"--enable-auto-tool-choice", "--tool-call-parser", "hermes"}));
    std::string out;
    EXPECT_TRUE(
        run_node("http://127.0.0.1:" + std::to_string(server.port()) + "/v1", "tiny", "real", &out))
        << out;
  }
  ServeProcess server(serve_args({}));
  std::string out;
  EXPECT_TRUE(run_node("http://127.0.0.1:" + std::to_string(server.port()) + "/v1", "tiny",
                       "disabled", &out))
      << out;
}

}  // namespace
}  // namespace crescent::testing
