#include "server/openai_server.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "net/http/http_client.h"
#include "server/fake_engine_client.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;

Deadline soon() {
  return Deadline::after_ms(20'000);
}

class OpenAiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OpenAiServerOptions options;
    options.served_model_name = "fake";
    options.http.max_body_bytes = 64 << 10;
    auto server = OpenAiServer::start(options);
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    server_ = std::move(server).value();
    FakeEngineClient::Options fake;
    fake.max_model_len = 64;
    engine_ = std::make_unique<FakeEngineClient>(fake);
    client_ = std::make_unique<HttpClient>("127.0.0.1", server_->port());
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
  }

  net::http::Response post(const std::string& path, const std::string& body,
                           net::http::Headers headers = {}) {
    headers["Content-Type"] = "application/json";
    auto r = client_->request("POST", path, body, headers, soon());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : net::http::Response{};
  }
  // Streams and returns the parsed events (without [DONE], which must be last).
  std::vector<json> stream(const std::string& path, const std::string& body) {
    std::vector<std::string> events;
    net::http::SseParser sse;
    auto r = client_->stream(
        "POST", path, body, {{"Content-Type", "application/json"}},
        [&](std::string_view d) {
          sse.feed(d, [&](std::string_view e) { events.emplace_back(e); });
          return true;
        },
        soon());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("content-type"), "text/event-stream");
    EXPECT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "[DONE]");
    std::vector<json> out;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      out.push_back(json::parse(events[i]));
    }
    return out;
  }
  double metrics_value(const std::string& name) {
    auto r = client_->request("GET", "/metrics", "", {}, soon());
    EXPECT_TRUE(r.is_ok());
    auto pos = r->body.find("\n" + name);
    EXPECT_NE(pos, std::string::npos) << name;
    auto end = r->body.find('\n', pos + 1);
    auto line = r->body.substr(pos + 1, end - pos - 1);
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  // The text the fake produces for this prompt.
  std::string expected_text(const std::string& prompt, int n) {
    auto ids = engine_->tokenize(prompt, true).value();
    std::string text;
    for (int k = 0; k < n; ++k) {
      text += engine_->token_text(FakeEngineClient::output_token(ids, k, engine_->vocab_size()));
    }
    return text;
  }

  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<FakeEngineClient> engine_;
  std::unique_ptr<HttpClient> client_;
};

TEST_F(OpenAiServerTest, HealthIs503UntilTheEngineIsSet) {
  auto r = client_->request("GET", "/health", "", {}, soon());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a"})").status, 503);
  server_->set_engine(engine_.get());
  r = client_->request("GET", "/health", "", {}, soon());
  EXPECT_EQ(r->status, 200);
  r = client_->request("GET", "/v1/models", "", {}, soon());
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "fake");
  EXPECT_EQ(json::parse(r->body)["data"][0]["max_model_len"], 64);
}

TEST_F(OpenAiServerTest, CompletionStreamedAndWholeAgree) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions", R"({"model":"fake","prompt":"hello world","max_tokens":5})",
                {{"X-Request-Id", "abc"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-request-id"), "abc");
  json body = json::parse(r.body);
  EXPECT_EQ(body["id"], "cmpl-abc");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], expected_text("hello world", 5));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);  // BOS + 2 words
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 8);

  auto events = stream("/v1/completions",
                       R"({"prompt":"hello world","max_tokens":5,"stream":true,
                           "stream_options":{"include_usage":true}})");
  std::string text;
  json finish;
  for (const auto& e : events) {
    if (!e["choices"].empty()) {
      text += e["choices"][0]["text"].get<std::string>();
      if (!e["choices"][0]["finish_reason"].is_null()) {
        finish = e["choices"][0]["finish_reason"];
      }
    }
  }
  EXPECT_EQ(text, body["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
  EXPECT_TRUE(events.back()["choices"].empty());
}

TEST_F(OpenAiServerTest, ChatStreamedAndWholeAgree) {
  server_->set_engine(engine_.get());
  std::string msgs = R"("messages":[{"role":"user","content":"hi there"}])";
  auto r = post("/v1/chat/completions", "{" + msgs + R"(,"max_tokens":4})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = json::parse(r.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  std::string whole = body["choices"][0]["message"]["content"];
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  auto events = stream("/v1/chat/completions", "{" + msgs + R"(,"max_tokens":4,"stream":true})");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& e : events) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    text += e["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, whole);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

// The request's template inputs reach render_chat as given: kwargs, a request template,
// continue_final_message, role developer, tool calls and tool results.
TEST_F(OpenAiServerTest, ChatTemplateInputsReachTheEngine) {
  server_->set_engine(engine_.get());
  auto prompt_tokens = [&](const std::string& extra) {
    auto r = post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1)" + extra + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["usage"]["prompt_tokens"].get<int>();
  };
  const int plain = prompt_tokens("");
  EXPECT_TRUE(engine_->last_render_options().add_generation_prompt);
  EXPECT_GT(prompt_tokens(R"(,"chat_template_kwargs":{"enable_thinking":false})"), plain);
  EXPECT_EQ(engine_->last_render_options().template_kwargs.dump(), R"({"enable_thinking":false})");
  EXPECT_GT(prompt_tokens(R"(,"chat_template":"{{ messages }} x")"), plain);
  EXPECT_EQ(engine_->last_render_options().chat_template.value(), "{{ messages }} x");
  EXPECT_LT(prompt_tokens(R"(,"add_generation_prompt":false)"), plain);
  EXPECT_FALSE(engine_->last_render_options().add_generation_prompt);

  auto r = post("/v1/chat/completions", R"({"messages":[{"role":"developer","content":"d"},
      {"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[
        {"id":"c","type":"function","function":{"name":"f","arguments":"{\"q\":1}"}}]},
      {"role":"tool","tool_call_id":"c","content":"42"},{"role":"assistant","content":"It is"}],
      "add_generation_prompt":false,"continue_final_message":true,"max_tokens":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(engine_->last_render_options().continue_final_message);
  std::vector<ChatMessage> messages = engine_->last_render_messages();
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[0].role, "developer");
  EXPECT_EQ(messages[2].fields["tool_calls"][0]["function"]["arguments"]["q"], 1);
  EXPECT_EQ(messages[3].fields["tool_call_id"], "c");

  // With tool_choice "none" the tools reach the template.
  EXPECT_GT(prompt_tokens(R"(,"tool_choice":"none",
      "tools":[{"type":"function","function":{"name":"f"}}])"),
            plain);
  EXPECT_EQ(engine_->last_render_options().tools[0]["function"]["name"], "f");

  // Refusals come back as 400s that name the field.
  r = post("/v1/chat/completions", R"({"messages":[{"role":"assistant","content":"x"}],
      "continue_final_message":true})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "continue_final_message");
  r = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(r.status, 400);  // tool_choice "auto" without --enable-auto-tool-choice
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "tool_choice");
}

TEST_F(OpenAiServerTest, KvTransferParamsAndLogprobsComeBack) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions",
                R"({"prompt":[5,6,7],"max_tokens":2,"logprobs":2,
                    "kv_transfer_params":{"do_remote_decode":true,"transfer_id":"xfer-9"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = json::parse(r.body);
  EXPECT_EQ(body["kv_transfer_params"]["transfer_id"], "xfer-9");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  auto lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 2u);
  EXPECT_EQ(lp["token_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  r = post("/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2,"logprobs":true,
               "top_logprobs":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  body = json::parse(r.body);
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
}

TEST_F(OpenAiServerTest, KvTransferParamsAndRankHeaderReachTheEngine) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions", R"({"prompt":"a b","max_tokens":1,
      "kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,
        "transfer_id":"xfer-1","remote_engine_id":"E1",
        "remote_bootstrap_addr":"http://127.0.0.1:8998","vendor_extra":[1,2]}})",
                {{"X-data-parallel-rank", "3"}});
  ASSERT_EQ(r.status, 200) << r.body;
  SubmitOptions got = engine_->last_submit_options();
  EXPECT_TRUE(got.kv_transfer.do_remote_prefill);
  EXPECT_FALSE(got.kv_transfer.do_remote_decode);
  EXPECT_EQ(got.kv_transfer.transfer_id, "xfer-1");
  EXPECT_EQ(got.kv_transfer.remote_engine_id, "E1");
  EXPECT_EQ(got.kv_transfer.remote_bootstrap_addr, "http://127.0.0.1:8998");
  EXPECT_EQ(got.data_parallel_rank, 3);
  // Echoed as sent, unknown keys included.
  EXPECT_EQ(json::parse(r.body)["kv_transfer_params"]["vendor_extra"], json::array({1, 2}));

  r = post("/v1/completions", R"({"prompt":"a b","max_tokens":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  got = engine_->last_submit_options();
  EXPECT_FALSE(got.kv_transfer.is_remote());
  EXPECT_EQ(got.data_parallel_rank, -1);
}

TEST_F(OpenAiServerTest, BadKvTransferParamsAndRankHeaderAre400) {
  server_->set_engine(engine_.get());
  struct Case {
    const char* params;
    const char* rank;
    const char* message_part;
  };
  const Case cases[] = {
      {R"({"do_remote_prefill":"yes"})", "", "'do_remote_prefill' must be a boolean"},
      {R"({"do_remote_decode":true})", "", "'transfer_id' is required"},
      {R"({"do_remote_decode":true,"do_remote_prefill":true,"transfer_id":"t"})", "",
       "cannot both be true"},
      {R"({"do_remote_prefill":true,"transfer_id":"t","remote_bootstrap_addr":"http://h:1"})", "",
       "'remote_engine_id' is required"},
      {R"({"do_remote_prefill":true,"transfer_id":"t","remote_engine_id":"e"})", "",
       "'remote_bootstrap_addr' is required"},
      {R"({"do_remote_decode":true,"transfer_id":7})", "", "'kv_transfer_params.transfer_id' must"},
      {R"({})", "-1", "X-data-parallel-rank must be a non-negative integer"},
      {R"({})", "two", "X-data-parallel-rank must be a non-negative integer"},
  };
  for (const Case& c : cases) {
    net::http::Headers headers;
    if (*c.rank != '\0') {
      headers["X-data-parallel-rank"] = c.rank;
    }
    auto r =
        post("/v1/completions",
             std::string(R"({"prompt":"a","max_tokens":1,"kv_transfer_params":)") + c.params + "}",
             headers);
    EXPECT_EQ(r.status, 400) << c.params << " " << r.body;
    EXPECT_NE(r.body.find(c.message_part), std::string::npos) << c.params << " " << r.body;
  }
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1})").status, 200);
}

TEST_F(OpenAiServerTest, ContinuousUsageStatsInEveryChunk) {
  server_->set_engine(engine_.get());
  // Alone: every chunk carries the running usage, and no usage-only chunk follows.
  auto events = stream("/v1/completions", R"({"prompt":"hello world","max_tokens":5,
      "stream":true,"stream_options":{"continuous_usage_stats":true}})");
  ASSERT_EQ(events.size(), 5u);  // the fake emits one token per step
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_TRUE(events[i]["usage"].is_object()) << events[i];
    EXPECT_EQ(events[i]["usage"]["prompt_tokens"], 3);
    EXPECT_EQ(events[i]["usage"]["completion_tokens"], i + 1);
    EXPECT_EQ(events[i]["usage"]["total_tokens"], i + 4);
    EXPECT_EQ(events[i]["choices"].size(), 1u);
  }
  // With include_usage, chat: the role chunk counts 0 tokens and the usage-only chunk ends it.
  events = stream("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],
      "max_tokens":3,"stream":true,
      "stream_options":{"include_usage":true,"continuous_usage_stats":true}})");
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.front()["usage"]["completion_tokens"], 0);
  for (size_t i = 1; i < events.size(); ++i) {
    ASSERT_TRUE(events[i]["usage"].is_object()) << events[i];
    EXPECT_EQ(events[i]["usage"]["completion_tokens"], std::min<size_t>(i, 3));
  }
  EXPECT_TRUE(events.back()["choices"].empty());
  // Without it, usage stays null until the last chunk, as before.
  events = stream("/v1/completions", R"({"prompt":"a","max_tokens":2,"stream":true,
      "stream_options":{"include_usage":true,"continuous_usage_stats":false}})");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0]["usage"].is_null());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 2);
}

// Checks that need the engine (vocabulary, the default max_tokens) and refusals over HTTP.
TEST_F(OpenAiServerTest, SamplingExtensionsCheckedAgainstTheEngine) {
  server_->set_engine(engine_.get());
  struct Case {
    const char* path;
    std::string body;
    const char* param;
  };
  const std::string chat = R"({"messages":[{"role":"user","content":"hi"}],)";
  const Case cases[] = {
      {"/v1/completions", R"({"prompt":"a","logit_bias":{"1000":1}})", "logit_bias"},
      // The completions default max_tokens is 16; chat's is the rest of the 64-token context.
      {"/v1/completions", R"({"prompt":"a","min_tokens":17})", "min_tokens"},
      {"/v1/chat/completions", chat + R"("min_tokens":64})", "min_tokens"},
      {"/v1/chat/completions",
       chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)"
              R"("schema":{"type":"object","minProperties":1}}}})",
       "response_format"},
      {"/v1/chat/completions", chat + R"("tools":[{"type":"function"}]})", "tools"},
      {"/v1/completions", R"({"prompt":"a","best_of":3,"n":4})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","best_of":2,"stream":true})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","best_of":129})", "best_of"},
  };
  for (const auto& c : cases) {
    auto r = post(c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["param"], c.param) << r.body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  }
  EXPECT_EQ(
      post("/v1/completions", R"({"prompt":"a","logit_bias":{"999":1},"min_tokens":16})").status,
      200);
}

TEST_F(OpenAiServerTest, BadInputsGetErrorsAndTheServerKeepsServing) {
  server_->set_engine(engine_.get());
  struct Case {
    const char* method;
    const char* path;
    std::string body;
    int status;
  };
  // 80 words: longer than the fake's 64-token context.
  std::string long_prompt = R"({"prompt":")";
  for (int i = 0; i < 80; ++i) {
    long_prompt.append("w").append(std::to_string(i)).append(" ");
  }
  long_prompt += R"("})";
  const Case cases[] = {
      {"POST", "/v1/completions", "{\"prompt\": ", 400},
      {"POST", "/v1/completions", R"({"prompt": 12})", 400},
      {"POST", "/v1/completions", R"({"prompt":"a","max_tokens":-3})", 400},
      {"POST", "/v1/completions", R"({"prompt":"a","max_tokens":100000})", 400},
      {"POST", "/v1/completions", long_prompt, 400},
      {"POST", "/v1/completions", "{\"prompt\": \"\xc3\x28\"}", 400},
      {"POST", "/v1/chat/completions", R"({"messages":[]})", 400},
      {"POST", "/v1/completions", R"({"model":"gpt-4","prompt":"a"})", 404},
      {"POST", "/v1/completions", R"({"prompt":")" + std::string(70 << 10, 'a') + R"("})", 413},
      {"GET", "/v2/nothing", "", 404},
      {"GET", "/v1/completions", "", 405},
      {"POST", "/v1/completions", R"({"prompt":[999999]})", 400},
  };
  for (const auto& c : cases) {
    auto r =
        client_->request(c.method, c.path, c.body, {{"Content-Type", "application/json"}}, soon());
    ASSERT_TRUE(r.is_ok()) << c.path << " " << c.body.substr(0, 60);
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 80) << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r->body;
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(e["error"].contains("type"));
    // Still serving, on a fresh connection if the server closed this one.
    auto ok = post("/v1/completions", R"({"prompt":"a","max_tokens":1})");
    EXPECT_EQ(ok.status, 200);
  }
}

// A number a double cannot hold is the client's mistake (400 naming the number), not a
// handler's exception (500); nested ones too.
TEST_F(OpenAiServerTest, NumberOverflowIs400AndTheServerKeepsServing) {
  server_->set_engine(engine_.get());
  struct Case {
    const char* path;
    std::string body;
    std::string number;
  };
  const Case cases[] = {
      {"/v1/completions", R"({"model":"fake","prompt":"a","max_tokens":1e400})", "1e400"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"temperature":-1e400})", "-1e400"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi","extra":{"deep":[1,2e999]}}]})", "2e999"},
  };
  for (const auto& c : cases) {
    auto r = post(c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    const std::string message = e["error"]["message"];
    EXPECT_NE(message.find("the request body has a number out of range"), std::string::npos)
        << message;
    EXPECT_NE(message.find(c.number + " does not fit in a double"), std::string::npos) << message;
    auto ok = post("/v1/completions", R"({"model":"fake","prompt":"a","max_tokens":1})");
    EXPECT_EQ(ok.status, 200) << ok.body;
  }
  auto chat = post("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"hi"}],"temperature":0})");
  EXPECT_EQ(chat.status, 200) << chat.body;
}

TEST_F(OpenAiServerTest, ClientDisconnectAbortsAndFreesBlocks) {
  server_->set_engine(engine_.get());
  {
    HttpClient leaver("127.0.0.1", server_->port());
    int seen = 0;
    auto r = leaver.stream(
        "POST", "/v1/completions", R"({"prompt":"a b c","max_tokens":60,"stream":true})", {},
        [&](std::string_view) { return ++seen < 2; }, soon());
    ASSERT_TRUE(r.is_ok());
  }
  for (int i = 0; i < 200 && server_->num_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->num_in_flight(), 0);
  EXPECT_EQ(engine_->metrics().num_blocks_used, 0);
  EXPECT_EQ(metrics_value(
                "crescent_request_success_total{model_name=\"fake\",finished_reason=\"abort\"}"),
            1);
}

// n > 1: one engine request per choice, the choices in index order, usage summed; streamed,
// each index gets its role chunk, text and finish_reason, and [DONE] comes once after all.
TEST_F(OpenAiServerTest, SeveralChoicesWholeAndStreamed) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions",
                R"({"prompt":"hello world","max_tokens":5,"n":3,"seed":40,"temperature":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = json::parse(r.body);
  ASSERT_EQ(body["choices"].size(), 3u) << body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], expected_text("hello world", 5));
    EXPECT_EQ(body["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 15);
  EXPECT_EQ(engine_->last_sampling().seed, 42u);  // choice i samples with seed + i (vLLM's)

  auto events = stream("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,
                           "stream":true,"stream_options":{"include_usage":true}})");
  std::map<int, std::string> text;
  std::map<int, int> roles, finishes;
  for (const auto& e : events) {
    for (const json& c : e["choices"]) {
      const int index = c["index"].get<int>();
      roles[index] += c["delta"].contains("role") ? 1 : 0;
      text[index] += c["delta"].value("content", "");
      finishes[index] += c["finish_reason"].is_null() ? 0 : 1;
    }
  }
  ASSERT_EQ(text.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_FALSE(text[i].empty()) << i;
  }
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 8);
  // The last choice writes [DONE] before it leaves the in-flight count: wait for it.
  for (int i = 0; i < 400 && server_->num_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->num_in_flight(), 0);
  EXPECT_EQ(engine_->metrics().num_blocks_used, 0);
}

// best_of: best_of engine requests, the n best returned (indexed from 0) and counted in usage;
// the sampled logprobs are asked of the engine to rank them but not returned unasked.
TEST_F(OpenAiServerTest, BestOfReturnsTheBestNChoices) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions",
                R"({"prompt":"hello world","max_tokens":5,"n":2,"best_of":4,"temperature":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = json::parse(r.body);
  ASSERT_EQ(body["choices"].size(), 2u) << body;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], expected_text("hello world", 5));
    EXPECT_TRUE(body["choices"][i]["logprobs"].is_null());
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 10);
  ASSERT_TRUE(engine_->last_sampling().logprobs.has_value());
  EXPECT_EQ(*engine_->last_sampling().logprobs, 0);
  for (int i = 0; i < 400 && server_->num_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->num_in_flight(), 0);
  EXPECT_EQ(engine_->metrics().num_blocks_used, 0);
  // best_of equal to n may stream: it is n.
  auto events = stream("/v1/completions",
                       R"({"prompt":"hi","max_tokens":2,"n":2,"best_of":2,"stream":true})");
  EXPECT_FALSE(events.empty());
}

TEST_F(OpenAiServerTest, SeveralChoicesAreRefusedInPdAndAbortedTogether) {
  server_->set_engine(engine_.get());
  auto r = post("/v1/completions", R"({"prompt":"a","max_tokens":1,"n":2,
      "kv_transfer_params":{"do_remote_decode":true,"transfer_id":"xfer-1"}})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "n");
  {
    HttpClient leaver("127.0.0.1", server_->port());
    int seen = 0;
    auto s = leaver.stream(
        "POST", "/v1/completions", R"({"prompt":"a b c","max_tokens":60,"n":3,"stream":true})", {},
        [&](std::string_view) { return ++seen < 2; }, soon());
    ASSERT_TRUE(s.is_ok());
  }
  for (int i = 0; i < 200 && server_->num_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->num_in_flight(), 0);
  EXPECT_EQ(engine_->metrics().num_blocks_used, 0);
}

std::string repeated(const std::string& piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) {
    out += piece;
  }
  return out;
}

// A decode request that the server refuses tells its prefill engine (through the engine's
// connector) that nobody will pull the KV, so P frees at once instead of at its deadline; an
// accepted one, or a refused one without do_remote_prefill, does not.
TEST_F(OpenAiServerTest, RefusedRemotePrefillRequestsReleaseThePrefillBlocks) {
  server_->set_engine(engine_.get());
  const std::string kv = R"("kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t-)";
  const std::string peer = R"(","remote_engine_id":"p","remote_bootstrap_addr":"http://h:1"})";
  // Refused while parsing (max_tokens 0), and after it (the prompt is too long for the model).
  EXPECT_EQ(
      post("/v1/completions", R"({"prompt":"a","max_tokens":0,)" + kv + "1" + peer + "}").status,
      400);
  EXPECT_EQ(post("/v1/completions",
                 R"({"prompt":")" + repeated("a ", 100) + R"(",)" + kv + "2" + peer + "}")
                .status,
            400);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":0})").status, 400);
  EXPECT_EQ(
      post("/v1/completions", R"({"prompt":"a","max_tokens":2,)" + kv + "3" + peer + "}").status,
      200);
  EXPECT_EQ(engine_->released_transfers(), (std::vector<std::string>{"t-1", "t-2"}));
}

TEST_F(OpenAiServerTest, DrainRefusesNewWork) {
  server_->set_engine(engine_.get());
  // Open the keep-alive connection first: a draining server accepts no new ones.
  ASSERT_EQ(client_->request("GET", "/health", "", {}, soon())->status, 200);
  server_->begin_drain();
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a"})").status, 503);
  auto r = client_->request("GET", "/health", "", {}, soon());
  EXPECT_EQ(r->status, 503);
}

}  // namespace
}  // namespace crescent::server
