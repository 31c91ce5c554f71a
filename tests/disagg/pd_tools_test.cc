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
  // tool_choice "required" with both tools: guided decoding on P's one token and on D gives
  // the call colocated serving gives (ids aside).
  json required = tool_chat(false);
  required["tool_choice"] = "required";
  required["max_tokens"] = 200;
  required["parallel_tool_calls"] = false;  // one call, so the array closes
  required.erase("ignore_eos");
  // Short strings, so that a random model's calls end within max_tokens.
  required["tools"][0]["function"]["parameters"]["properties"]["city"]["maxLength"] = 6;
  required["tools"][1]["function"]["parameters"]["properties"]["tz"]["maxLength"] = 6;
  Reply want_call = send(ref->port, "/v1/chat/completions", required);
  Reply got_call = send(pd->proxy.port, "/v1/chat/completions", required);
  ASSERT_TRUE(want_call.is_ok()) << want_call.describe();
  ASSERT_TRUE(got_call.is_ok()) << got_call.describe() << "\n" << pd->outputs();
  auto calls_of = [](const Reply& r) {
    json calls = json::parse(r.raw)["choices"][0]["message"].value("tool_calls", json::array());
    for (json& c : calls) {
      c.erase("id");
    }
    return calls;
  };
  EXPECT_FALSE(calls_of(want_call).empty()) << want_call.raw;
  EXPECT_EQ(calls_of(got_call), calls_of(want_call));
  // Two tools of one name cannot be "required": refused (by P and D), the client sees a 400.
  required["tools"][1]["function"]["name"] = "get_weather";
  Reply refused = send(pd->proxy.port, "/v1/chat/completions", required);
  EXPECT_EQ(refused.status, 400) << refused.describe();
  EXPECT_EQ(wait_blocks_used(pd->prefill.port, 0, Deadline::after_ms(35'000)), 0) << pd->outputs();
  EXPECT_EQ(pd->stop_all(), "");
}

}  // namespace
}  // namespace crescent::testing
