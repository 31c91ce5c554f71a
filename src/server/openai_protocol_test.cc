#include "server/openai_protocol.h"

#include <gtest/gtest.h>

namespace crescent::server {
namespace {

GenerationRequest parse_ok(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  GenerationRequest r;
  auto e = parse_generation_request(body, endpoint, &r);
  EXPECT_FALSE(e.has_value()) << body << " -> " << (e ? e->message : "");
  return r;
}

ApiError parse_error(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  GenerationRequest r;
  auto e = parse_generation_request(body, endpoint, &r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

TEST(OpenAiProtocolTest, ParsesEverySamplingField) {
  auto r = parse_ok(R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,
      "top_k":40,"min_p":0.1,"seed":42,"stop":["a","b"],"stop_token_ids":[3],"ignore_eos":true,
      "logprobs":2,"stream":true,"stream_options":{"include_usage":true},
      "kv_transfer_params":{"do_remote_decode":true,"transfer_id":"xfer-1"}})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text.value(), "hi");
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed.value(), 42u);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{3}));
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.logprobs.value(), 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.kv_transfer_params.value()["transfer_id"], "xfer-1");
}

TEST(OpenAiProtocolTest, PromptShapes) {
  EXPECT_EQ(parse_ok(R"({"prompt":[1,2,3]})").prompt_token_ids.value(),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_ok(R"({"prompt":[[4,5]]})").prompt_token_ids.value(),
            (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse_ok(R"({"prompt":["x"]})").prompt_text.value(), "x");
  EXPECT_EQ(parse_error(R"({"prompt":["x","y"]})").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":[1,-2]})").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":5})").param, "prompt");
  EXPECT_EQ(parse_error(R"({})").param, "prompt");
}

TEST(OpenAiProtocolTest, ChatFields) {
  auto r = parse_ok(R"({"messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_completion_tokens":3,"logprobs":true,"top_logprobs":2})",
                    Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.sampling.max_tokens, 3);
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_EQ(r.sampling.logprobs.value(), 2);
  EXPECT_EQ(parse_error(R"({"messages":[]})", Endpoint::kChat).param, "messages");
  EXPECT_EQ(parse_error(R"({"messages":"hi"})", Endpoint::kChat).param, "messages");
  EXPECT_EQ(parse_error(R"({"messages":[{"content":"x"}]})", Endpoint::kChat).param, "messages");
}

TEST(OpenAiProtocolTest, BadValuesNameTheirField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt":"x","max_tokens":-1})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":99999999999})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","temperature":-0.1})", "temperature"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","min_p":2})", "min_p"},
      {R"({"prompt":"x","n":2})", "n"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","model":7})", "model"},
      {R"({"prompt":"x","kv_transfer_params":"x"})", "kv_transfer_params"},
      {R"({"prompt":"x","presence_penalty":0.5})", "presence_penalty"},
  };
  for (const auto& c : cases) {
    ApiError e = parse_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiProtocolTest, MalformedJsonAndInvalidUtf8) {
  EXPECT_NE(parse_error("{\"prompt\": ").message.find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("{\"prompt\": \"\xff\xfe\"}").message.find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(parse_error("[1,2]").message.find("object"), std::string::npos);
}

TEST(OpenAiProtocolTest, ErrorShape) {
  auto j = error_json(bad_request("bad", "max_tokens"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(OpenAiProtocolTest, DumpReplacesInvalidUtf8) {
  nlohmann::json j = {{"text", std::string("a\xff")}};
  EXPECT_EQ(dump_json(j), "{\"text\":\"a\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace crescent::server
