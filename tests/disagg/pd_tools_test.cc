// Tools through a real prefill + decode pair behind the real proxy: the tools reach both
// templates (P prefills the prompt D renders, so D's greedy output equals a colocated
// server's), the prefill server needs no tool parser (its output is thrown away), and the
// decode server, started with --enable-auto-tool-choice --tool-call-parser hermes, answers as
// the colocated server with the same flags does, whole and streamed. A random-weight model
// writes no tool call; the parsing itself is tested in src/server (tool_parsers,
// openai_server_tools_test) and tests/server/openai_tools_node_test.

#include <gtest/gtest.h>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"

namespace crescent::testing {
namespace {

// tiny-llama's own template shows no tools; this one does (on every server of the test).
constexpr char kToolsTemplate[] =
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}: {{ t.function.description "
    "}}{% endfor %}\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor "
    "%}assistant:";
const std::vector<std::string> kToolFlags = {"--enable-auto-tool-choice", "--tool-call-parser",
                                             "hermes", "--chat-template", kToolsTemplate};

json tool_chat(bool stream) {
  json body = {{"model", kModelName}, {"temperature", 0}, {"ignore_eos", true}, {"max_tokens", 12}};
  body["messages"] = json::array(
      {{{"role", "user"}, {"content", "what is the weather in Paris and the time in Tokyo"}}});
  body["tools"] = json::parse(R"([
      {"type":"function","function":{"name":"get_weather","description":"weather of a city",
       "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
      {"type":"function","function":{"name":"get_time",
       "parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}])");
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

TEST(PdToolsTest, ToolsReachPrefillAndDecodeAndTheAnswerEqualsColocated) {
  ServeSpec both;
  both.model_preset = "tiny-llama";  // its output depends on the context (see pd_correctness)
  both.extra_args = kToolFlags;
  auto ref = launch_serve("ref", both);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  ServeSpec prefill;
  prefill.model_preset = both.model_preset;
  prefill.kv_transfer_timeout_s = 20;
  prefill.extra_args = {"--chat-template", kToolsTemplate};
  ServeSpec decode = prefill;
  decode.extra_args = kToolFlags;
  auto pd = start_pd(prefill, decode, /*with_proxy=*/true);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  ASSERT_TRUE(wait_ready(&*ref).is_ok()) << ref->output();

  for (bool stream : {false, true}) {
    const json body = tool_chat(stream);
    Reply want = send(ref->port, "/v1/chat/completions", body);
    Reply got = send(pd->proxy.port, "/v1/chat/completions", body);
    ASSERT_TRUE(want.is_ok()) << want.describe();
    ASSERT_TRUE(got.is_ok()) << got.describe() << "\n" << pd->outputs();
    EXPECT_EQ(got.text, want.text) << "stream " << stream;
    EXPECT_EQ(got.finish_reason, want.finish_reason);
    EXPECT_EQ(got.usage_of("prompt_tokens"), want.usage_of("prompt_tokens"));
    EXPECT_EQ(got.usage_of("completion_tokens"), 12);
  }
  // Without the tools the prompt is shorter: they were rendered.
  json plain = tool_chat(false);
  plain.erase("tools");
  Reply without = send(pd->proxy.port, "/v1/chat/completions", plain);
  ASSERT_TRUE(without.is_ok()) << without.describe();
  EXPECT_LT(without.usage_of("prompt_tokens"),
            send(ref->port, "/v1/chat/completions", tool_chat(false)).usage_of("prompt_tokens"));
  // tool_choice "required" is refused by D, and the client sees D's 400.
  json required = tool_chat(false);
  required["tool_choice"] = "required";
  Reply refused = send(pd->proxy.port, "/v1/chat/completions", required);
  EXPECT_EQ(refused.status, 400) << refused.describe();
  EXPECT_EQ(wait_blocks_used(pd->prefill.port, 0, Deadline::after_ms(35'000)), 0) << pd->outputs();
  EXPECT_EQ(pd->stop_all(), "");
}

}  // namespace
}  // namespace crescent::testing
