// Tool calls through the server's HTTP front: --enable-auto-tool-choice / --tool-call-parser,
// and the calls parsed from output that the fake engine scripts, whole and streamed.

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "net/http/http_client.h"
#include "server/fake_engine_client.h"
#include "server/openai_server.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;

const std::vector<std::string> kHermesReply = {
    "Let",
    " me",
    " check.\n<tool",
    "_call>\n{\"name\": \"get_weather\", ",
    "\"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}",
    "\n</tool_call>",
    "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
};
const std::vector<std::string> kMalformedReply = {"<tool_call>\n{\"name\": \"f\", ",
                                                  "\"arguments\": {oops}}\n</tool_call>"};
const std::vector<std::string> kLlamaReply = {
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
    "; {\"name\": ", "\"get_time\", \"parameters\": {\"tz\": \"CET\"}}"};

constexpr char kTools[] =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"}}}}},{"type":"function","function":{"name":"get_time"}}])";

std::string chat_body(const std::string& word, const std::string& extra = "") {
  return R"({"model":"fake","max_tokens":20,"messages":[{"role":"user","content":"tell )" + word +
         R"("}],"tools":)" + kTools + extra + "}";
}

class ToolCallServerTest : public ::testing::Test {
 protected:
  void start(bool enable_auto_tool_choice, const std::string& parser) {
    OpenAiServerOptions options;
    options.served_model_name = "fake";
    options.enable_auto_tool_choice = enable_auto_tool_choice;
    options.tool_call_parser = parser;
    auto server = OpenAiServer::start(options);
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    server_ = std::move(server).value();
    FakeEngineClient::Options fake;
    fake.max_model_len = 512;
    fake.scripted_replies = {{"weather", kHermesReply},
                             {"broken", kMalformedReply},
                             {"llama", kLlamaReply},
                             {"named", {"{\"city\": ", "\"Paris\"}"}},
                             {"required",
                              {R"([{"name": "get_weather", "parameters": {"city": "Paris"}}, )",
                               R"({"name": "get_weather", "parameters": {"city": "Oslo"}}])"}},
                             {"cut", {R"([{"name": "f", "param)"}}};
    engine_ = std::make_unique<FakeEngineClient>(fake);
    server_->set_engine(engine_.get());
    client_ = std::make_unique<HttpClient>("127.0.0.1", server_->port());
  }
  void TearDown() override {
    client_.reset();
    if (server_) {
      server_->stop();
    }
  }

  net::http::Response post(const std::string& body) {
    auto r = client_->request("POST", "/v1/chat/completions", body,
                              {{"Content-Type", "application/json"}}, Deadline::after_ms(20'000));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : net::http::Response{};
  }
  std::vector<json> stream(const std::string& body) {
    std::vector<std::string> events;
    net::http::SseParser sse;
    auto r = client_->stream(
        "POST", "/v1/chat/completions", body, {{"Content-Type", "application/json"}},
        [&](std::string_view d) {
          sse.feed(d, [&](std::string_view e) { events.emplace_back(e); });
          return true;
        },
        Deadline::after_ms(20'000));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->status, 200);
    EXPECT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "[DONE]");
    std::vector<json> out;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      out.push_back(json::parse(events[i]));
    }
    return out;
  }

  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<FakeEngineClient> engine_;
  std::unique_ptr<HttpClient> client_;
};

// What a client assembles from the stream: the content, the calls by index (id, type, name,
// arguments concatenated), and the last finish_reason.
struct Assembled {
  std::string content;
  std::map<int, json> calls;
  json finish_reason;
};

Assembled assemble(const std::vector<json>& chunks) {
  Assembled a;
  for (const json& c : chunks) {
    if (c["choices"].empty()) {
      continue;
    }
    const json& choice = c["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      a.content += delta["content"].get<std::string>();
    }
    for (const json& t : delta.value("tool_calls", json::array())) {
      json& call = a.calls[t["index"].get<int>()];
      if (t.contains("id")) {
        EXPECT_FALSE(call.contains("id")) << "a call's id comes once: " << c.dump();
        call["id"] = t["id"];
        call["type"] = t["type"];
        call["function"]["name"] = t["function"]["name"];
        call["function"]["arguments"] = "";
      }
      if (t["function"].contains("arguments")) {
        call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() +
                                        t["function"]["arguments"].get<std::string>();
      }
    }
    if (!choice["finish_reason"].is_null()) {
      EXPECT_TRUE(a.finish_reason.is_null()) << "one finish_reason: " << c.dump();
      a.finish_reason = choice["finish_reason"];
    }
  }
  return a;
}

TEST_F(ToolCallServerTest, AutoToolChoiceNeedsBothFlags) {
  start(false, "");
  auto r = post(chat_body("weather"));
  ASSERT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "tool_choice");
  EXPECT_NE(e["message"].get<std::string>().find(
                "lacks --enable-auto-tool-choice and --tool-call-parser"),
            std::string::npos)
      << e;
  EXPECT_EQ(post(chat_body("weather", R"(,"tool_choice":"auto")")).status, 400);
  // "none": the tools only reach the template and the output is plain content.
  r = post(chat_body("weather", R"(,"tool_choice":"none")"));
  ASSERT_EQ(r.status, 200) << r.body;
  json message = json::parse(r.body)["choices"][0]["message"];
  EXPECT_NE(message["content"].get<std::string>().find("<tool_call>"), std::string::npos);
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_FALSE(engine_->last_render_options().tools.is_null());
  // A prefill server's request (its output is thrown away) needs no parser.
  r = post(chat_body("weather",
                     R"(,"kv_transfer_params":{"do_remote_decode":true,"transfer_id":"xfer-1"})"));
  EXPECT_EQ(r.status, 200) << r.body;
  // tool_choice "required" with two tools is honoured whatever the flags: each call's name
  // picks its own parameters' schema (a tagged union in the grammar).
  r = post(chat_body("weather", R"(,"tool_choice":"required")"));
  EXPECT_EQ(r.status, 200) << r.body;
  const std::string schema = engine_->last_sampling().guided.json_schema;
  EXPECT_NE(schema.find("\"anyOf\""), std::string::npos) << schema;
}

// A named function: the output (constrained to the function's parameters) is its arguments,
// without any parser flag; streamed, the head comes first and the arguments as they come.
TEST_F(ToolCallServerTest, NamedToolChoiceTurnsTheConstrainedOutputIntoTheCall) {
  start(false, "");
  const std::string named =
      R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})";
  auto r = post(chat_body("named", named));
  ASSERT_EQ(r.status, 200) << r.body;
  const engine::GuidedDecoding guided = engine_->last_sampling().guided;
  EXPECT_EQ(guided.kind, engine::GuidedDecoding::Kind::kJsonSchema);
  EXPECT_EQ(json::parse(guided.json_schema),
            json::parse(R"({"type":"object","properties":{"city":{"type":"string"}}})"));
  json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["message"]["content"], "");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("chatcmpl-tool-"));
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], R"({"city": "Paris"})");

  Assembled a = assemble(stream(chat_body("named", named + R"(,"stream":true)")));
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(a.calls[0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(a.finish_reason, "stop");
}

// "required" with one tool: the output is vLLM's JSON array of {"name", "parameters"}.
TEST_F(ToolCallServerTest, RequiredToolChoiceParsesTheArrayOfCalls) {
  start(false, "");
  const std::string body =
      R"({"model":"fake","max_tokens":20,"messages":[{"role":"user","content":"tell required"}],)"
      R"("tool_choice":"required","tools":[{"type":"function","function":{"name":"get_weather",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  auto r = post(body + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  const json schema = json::parse(engine_->last_sampling().guided.json_schema);
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["items"]["properties"]["name"]["enum"], json::array({"get_weather"}));
  json message = json::parse(r.body)["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 2u) << message;
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], R"({"city":"Oslo"})");
  Assembled a = assemble(stream(body + R"(,"stream":true})"));
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[1]["function"]["name"], "get_weather");
  EXPECT_EQ(a.calls[1]["function"]["arguments"], R"({"city":"Oslo"})");
  // Output that is not the array (here: cut) stays content.
  r = post(R"({"model":"fake","max_tokens":20,"messages":[{"role":"user","content":"tell cut"}],)"
           R"("tool_choice":"required","tools":[{"type":"function","function":{"name":"f"}}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  message = json::parse(r.body)["choices"][0]["message"];
  EXPECT_FALSE(message.contains("tool_calls")) << message;
  EXPECT_EQ(message["content"], R"([{"name": "f", "param)");
}

TEST_F(ToolCallServerTest, OneFlagAloneIsNamed) {
  start(false, "hermes");
  auto r = post(chat_body("weather"));
  ASSERT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("lacks --enable-auto-tool-choice."), std::string::npos) << r.body;
  server_->stop();
  start(true, "");
  r = post(chat_body("weather"));
  ASSERT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("lacks --tool-call-parser."), std::string::npos) << r.body;
}

TEST_F(ToolCallServerTest, UnknownParserStopsTheStart) {
  OpenAiServerOptions options;
  options.tool_call_parser = "mistral";
  auto server = OpenAiServer::start(options);
  ASSERT_FALSE(server.is_ok());
  EXPECT_NE(server.status().message().find("hermes, llama3_json"), std::string::npos);
}

TEST_F(ToolCallServerTest, HermesCallsWholeAndStreamedAgree) {
  start(true, "hermes");
  auto r = post(chat_body("weather"));
  ASSERT_EQ(r.status, 200) << r.body;
  json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& message = choice["message"];
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["content"], "Let me check.\n");
  ASSERT_EQ(message["tool_calls"].size(), 2u) << message;
  const json& first = message["tool_calls"][0];
  EXPECT_TRUE(first["id"].get<std::string>().starts_with("chatcmpl-tool-"));
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(first["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Zürich", "days": [1, 2]})"));
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], "{}");

  const std::vector<json> chunks = stream(chat_body("weather", R"(,"stream":true)"));
  for (const json& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content")) {
      EXPECT_EQ(delta["content"].get<std::string>().find("tool_"), std::string::npos)
          << "markup leaked as content: " << c.dump();
    }
  }
  Assembled a = assemble(chunks);
  EXPECT_EQ(a.content, "Let me check.\n");
  EXPECT_EQ(a.finish_reason, "tool_calls");
  ASSERT_EQ(a.calls.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& whole = message["tool_calls"][i];
    EXPECT_EQ(a.calls[i]["type"], "function");
    EXPECT_EQ(a.calls[i]["function"]["name"], whole["function"]["name"]);
    EXPECT_EQ(json::parse(a.calls[i]["function"]["arguments"].get<std::string>()),
              json::parse(whole["function"]["arguments"].get<std::string>()));
  }
  EXPECT_NE(a.calls[0]["id"], a.calls[1]["id"]);
  // The hermes markup may be special tokens: kept in the text, as vLLM does.
  EXPECT_FALSE(engine_->last_sampling().skip_special_tokens);
  post(chat_body("weather", R"(,"tool_choice":"none")"));
  EXPECT_TRUE(engine_->last_sampling().skip_special_tokens);
}

TEST_F(ToolCallServerTest, ParallelToolCallsFalseKeepsTheFirstCall) {
  start(true, "hermes");
  auto r = post(chat_body("weather", R"(,"parallel_tool_calls":false)"));
  ASSERT_EQ(r.status, 200) << r.body;
  json message = json::parse(r.body)["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  Assembled a =
      assemble(stream(chat_body("weather", R"(,"parallel_tool_calls":false,"stream":true)")));
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(a.finish_reason, "tool_calls");
  EXPECT_EQ(post(chat_body("weather", R"(,"parallel_tool_calls":"no")")).status, 400);
}

TEST_F(ToolCallServerTest, PlainAndMalformedOutputStaysContent) {
  start(true, "hermes");
  // No scripted reply: the fake's words, finish_reason as the engine said.
  auto r = post(chat_body("nothing", R"(,"max_tokens":4)"));
  ASSERT_EQ(r.status, 200) << r.body;
  json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_FALSE(choice["message"]["content"].get<std::string>().empty());
  // Malformed JSON in the block: the whole text is content, as in vLLM.
  const std::string text = kMalformedReply[0] + kMalformedReply[1];
  r = post(chat_body("broken"));
  choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["message"]["content"], text);
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  Assembled a = assemble(stream(chat_body("broken", R"(,"stream":true)")));
  EXPECT_EQ(a.content, text);
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.finish_reason, "stop");
}

TEST_F(ToolCallServerTest, Llama3JsonCalls) {
  start(true, "llama3_json");
  auto r = post(chat_body("llama"));
  ASSERT_EQ(r.status, 200) << r.body;
  json message = json::parse(r.body)["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], R"({"tz":"CET"})");
  Assembled a = assemble(stream(chat_body("llama", R"(,"stream":true)")));
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(a.finish_reason, "tool_calls");
}

}  // namespace
}  // namespace crescent::server
