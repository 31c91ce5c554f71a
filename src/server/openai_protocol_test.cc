#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <tuple>

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

TEST(OpenAiProtocolTest, ChatContentParts) {
  // A string content leaves parts empty; a parts list keeps its order, images included.
  auto r = parse_ok(R"({"messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"Look: "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,Zm9v","detail":"high"}},
        {"type":"text","text":" and "},
        {"type":"image_url","image_url":"http://127.0.0.1/b.png"},
        {"type":"text","text":"?"}]},
      {"role":"assistant","content":[{"type":"text","text":"two"}]},
      {"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///m/c.png"}}]}]})",
                    Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].content, "s");
  EXPECT_TRUE(r.messages[0].parts.empty());
  const ChatMessage& m = r.messages[1];
  EXPECT_EQ(m.content, "Look:  and ?");
  ASSERT_EQ(m.parts.size(), 5u);
  const bool is_image[] = {false, true, false, true, false};
  const char* texts[] = {"Look: ", "", " and ", "", "?"};
  for (size_t i = 0; i < m.parts.size(); ++i) {
    EXPECT_EQ(m.parts[i].is_image, is_image[i]) << i;
    EXPECT_EQ(m.parts[i].text, texts[i]) << i;
  }
  ASSERT_EQ(r.messages[2].parts.size(), 1u);
  EXPECT_EQ(r.messages[2].content, "two");
  ASSERT_EQ(r.messages[3].parts.size(), 1u);
  EXPECT_TRUE(r.messages[3].parts[0].is_image);
  EXPECT_EQ(r.messages[3].content, "");
  ASSERT_EQ(r.images.size(), 3u);
  EXPECT_EQ(r.images[0].url, "data:image/png;base64,Zm9v");
  EXPECT_EQ(r.images[0].message_index, 1);
  EXPECT_EQ(r.images[1].url, "http://127.0.0.1/b.png");
  EXPECT_EQ(r.images[1].message_index, 1);
  EXPECT_EQ(r.images[2].url, "file:///m/c.png");
  EXPECT_EQ(r.images[2].message_index, 3);

  // Images are the template's business in any role (Qwen2-VL's renders them everywhere), and
  // an empty parts list is an empty content.
  auto any_role = parse_ok(R"({"messages":[
      {"role":"system","content":[{"type":"image_url","image_url":{"url":"u1"}}]},
      {"role":"assistant","content":[{"type":"image_url","image_url":{"url":"u2"}}]},
      {"role":"user","content":[]}]})",
                           Endpoint::kChat);
  ASSERT_EQ(any_role.images.size(), 2u);
  EXPECT_EQ(any_role.images[1].message_index, 1);
  EXPECT_TRUE(any_role.messages[2].parts.empty());
  EXPECT_EQ(any_role.messages[2].content, "");
  EXPECT_TRUE(
      parse_ok(R"({"messages":[{"role":"user","content":"x"}]})", Endpoint::kChat).images.empty());
}

TEST(OpenAiProtocolTest, ChatContentPartErrors) {
  struct Case {
    const char* content;
    const char* message_part;
  };
  const Case cases[] = {
      {R"([{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}])",
       "'input_audio' is not supported"},
      {R"([{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}])",
       "'video_url' is not supported"},
      {R"([{"type":"file","file":{"file_id":"f"}}])", "'file' is not supported"},
      {R"([{"type":"image","image":"x"}])", "'image' is not supported"},
      {R"([{"type":"text","text":"a"},{"type":"refusal","refusal":"no"}])", "'refusal'"},
      {R"([{"text":"a"}])", "needs a string 'type'"},
      {R"([{"type":7}])", "needs a string 'type'"},
      {R"(["just a string"])", "must be an object"},
      {R"([{"type":"text"}])", "needs a string 'text'"},
      {R"([{"type":"text","text":5}])", "needs a string 'text'"},
      {R"([{"type":"image_url"}])", "with a string url"},
      {R"([{"type":"image_url","image_url":{}}])", "with a string url"},
      {R"([{"type":"image_url","image_url":{"url":5}}])", "with a string url"},
      {R"([{"type":"image_url","image_url":{"url":""}}])", "must not be empty"},
      {R"([{"type":"image_url","image_url":""}])", "must not be empty"},
      {R"([{"type":"image_url","image_url":{"url":"u","detail":1}}])", "detail"},
      {R"(5)", "a string or a list of content parts"},
  };
  for (const Case& c : cases) {
    const std::string body =
        std::string(R"({"messages":[{"role":"user","content":)") + c.content + "}]}";
    ApiError e = parse_error(body, Endpoint::kChat);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, "messages") << body;
    EXPECT_NE(e.message.find(c.message_part), std::string::npos) << body << " -> " << e.message;
  }
  // A long type name is cut short in the message.
  ApiError e = parse_error(
      R"({"messages":[{"role":"user","content":[{"type":")" + std::string(10000, 'z') + R"("}]}]})",
      Endpoint::kChat);
  EXPECT_LT(e.message.size(), 200u);
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
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":129})", "n"},
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

TEST(OpenAiProtocolTest, ParsesVllmSamplingExtensions) {
  auto r = parse_ok(R"({"prompt":"x","max_tokens":8,"min_tokens":3,
      "include_stop_str_in_output":true,"logit_bias":{"10":5,"9":-100,"07":100.0},
      "stream":true,"stream_options":{"continuous_usage_stats":true}})");
  EXPECT_EQ(r.sampling.min_tokens, 3);
  EXPECT_TRUE(r.sampling.include_stop_str_in_output);
  // Ordered by id (not as the keys sort as strings), "07" is token 7.
  EXPECT_EQ(r.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, 100.0f}, {9, -100.0f}, {10, 5.0f}}));
  EXPECT_TRUE(r.continuous_usage_stats);
  EXPECT_FALSE(r.include_usage);
  // Defaults: nothing asked for.
  r = parse_ok(R"({"prompt":"x","logit_bias":{},"min_tokens":null,"stream_options":{}})");
  EXPECT_EQ(r.sampling.min_tokens, 0);
  EXPECT_FALSE(r.sampling.include_stop_str_in_output);
  EXPECT_TRUE(r.sampling.logit_bias.empty());
  EXPECT_FALSE(r.continuous_usage_stats);
  // min_tokens may equal max_tokens; without max_tokens it is checked once the default is known.
  EXPECT_EQ(parse_ok(R"({"prompt":"x","max_tokens":4,"min_tokens":4})").sampling.min_tokens, 4);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","min_tokens":400})").sampling.min_tokens, 400);
  // A prefill server's body has max_tokens 1 (set by the proxy) and the client's min_tokens:
  // the decode server applies it, so the prefill side takes it as 1 instead of refusing.
  r = parse_ok(R"({"prompt":"x","max_tokens":1,"min_tokens":5,
      "kv_transfer_params":{"do_remote_decode":true,"transfer_id":"xfer-1"}})");
  EXPECT_EQ(r.sampling.min_tokens, 1);
}

TEST(OpenAiProtocolTest, BadSamplingExtensionsNameTheirField) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;  // a piece of the message
  };
  const Case cases[] = {
      {R"({"prompt":"x","min_tokens":-1})", "min_tokens", "at least 0"},
      {R"({"prompt":"x","min_tokens":1.5})", "min_tokens", "an integer"},
      {R"({"prompt":"x","max_tokens":3,"min_tokens":4})", "min_tokens", "greater than"},
      {R"({"prompt":"x","max_completion_tokens":3,"min_tokens":4})", "min_tokens", "greater"},
      {R"({"prompt":"x","include_stop_str_in_output":1})", "include_stop_str_in_output",
       "a boolean"},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias", "an object"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias", "'abc'"},
      {R"({"prompt":"x","logit_bias":{"-1":1}})", "logit_bias", "'-1'"},
      {R"({"prompt":"x","logit_bias":{"5 ":1}})", "logit_bias", "token ids"},
      {R"({"prompt":"x","logit_bias":{"99999999999":1}})", "logit_bias", "token ids"},
      {R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias", "[-100, 100]"},
      {R"({"prompt":"x","logit_bias":{"5":-100.5}})", "logit_bias", "[-100, 100]"},
      {R"({"prompt":"x","logit_bias":{"5":"1"}})", "logit_bias", "numbers"},
      {R"({"prompt":"x","logit_bias":{"5":1,"05":2}})", "logit_bias", "more than once"},
      {R"({"prompt":"x","stream_options":{"continuous_usage_stats":"yes"}})",
       "continuous_usage_stats", "a boolean"},
  };
  for (const auto& c : cases) {
    ApiError e = parse_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.message), std::string::npos) << c.body << " -> " << e.message;
  }
}

// Fields crescent does not implement are refused by name unless they ask for nothing, on both
// endpoints; what they would ask for is never silently dropped.
// vLLM's rule: stream_options on a request that does not stream would be silently dropped.
TEST(OpenAiProtocolTest, StreamOptionsWithoutStreamIs400) {
  for (const char* body : {
           R"({"prompt":"x","stream_options":{"include_usage":true}})",
           R"({"prompt":"x","stream":false,"stream_options":{"include_usage":true}})",
           R"({"prompt":"x","stream":null,"stream_options":{"continuous_usage_stats":false}})",
       }) {
    ApiError e = parse_error(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, "stream_options") << body;
    EXPECT_NE(e.message.find("'stream_options' can only be given when 'stream' is true"),
              std::string::npos)
        << e.message;
  }
  ApiError chat = parse_error(
      R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})",
      Endpoint::kChat);
  EXPECT_EQ(chat.param, "stream_options");
  // {} and null ask for nothing; with stream they are honoured.
  EXPECT_FALSE(parse_ok(R"({"prompt":"x","stream_options":{}})").include_usage);
  EXPECT_FALSE(parse_ok(R"({"prompt":"x","stream_options":null})").include_usage);
  EXPECT_TRUE(parse_ok(R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true}})")
                  .include_usage);
}

TEST(OpenAiProtocolTest, DeepNestingIs400) {
  const std::string deep = std::string(600, '[') + std::string(600, ']');
  ApiError e = parse_error(R"({"prompt":"x","user":)" + deep + "}");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("the request body nests arrays and objects more than 512 levels deep"),
            std::string::npos)
      << e.message;
  // Within the limit, an unknown field nests as deep as it likes.
  const std::string ok_deep = std::string(500, '[') + std::string(500, ']');
  parse_ok(R"({"prompt":"x","user":)" + ok_deep + "}");
}

TEST(OpenAiProtocolTest, StructuredOutputFieldsBecomeGuidedDecoding) {
  using Kind = engine::GuidedDecoding::Kind;
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  GenerationRequest r = parse_ok(chat + R"("response_format":{"type":"text"}})", Endpoint::kChat);
  EXPECT_EQ(r.sampling.guided.kind, Kind::kNone);
  r = parse_ok(chat + R"("response_format":{"type":"json_object"}})", Endpoint::kChat);
  EXPECT_EQ(r.sampling.guided.kind, Kind::kJsonObject);
  // The schema keeps the client's property order (the output follows it).
  r = parse_ok(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)"
                      R"("schema":{"type":"object","properties":{"z":{"type":"integer"},)"
                      R"("a":{"type":"string"}},"required":["z","a"]}}}})",
               Endpoint::kChat);
  EXPECT_EQ(r.sampling.guided.kind, Kind::kJsonSchema);
  EXPECT_LT(r.sampling.guided.json_schema.find("\"z\""),
            r.sampling.guided.json_schema.find("\"a\""));
  r = parse_ok(R"({"prompt":"x","guided_json":{"type":"array"}})");
  EXPECT_EQ(r.sampling.guided.kind, Kind::kJsonSchema);
  r = parse_ok(R"({"prompt":"x","guided_json":"{\"type\": \"boolean\"}"})");
  EXPECT_EQ(r.sampling.guided.json_schema, R"({"type": "boolean"})");
  r = parse_ok(R"({"prompt":"x","guided_choice":["yes","no"]})");
  EXPECT_EQ(r.sampling.guided.kind, Kind::kChoice);
  EXPECT_EQ(r.sampling.guided.choices, (std::vector<std::string>{"yes", "no"}));
  r = parse_ok(R"({"prompt":"x","guided_regex":"[0-9]{3}-[a-z]+"})");
  EXPECT_EQ(r.sampling.guided.kind, Kind::kRegex);
  EXPECT_EQ(r.sampling.guided.regex, "[0-9]{3}-[a-z]+");

  struct Case {
    std::string fields;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"("response_format":{"type":"xml"})", "response_format", "must be null or have"},
      {R"("response_format":{"type":"json_schema"})", "response_format", "needs \"json_schema\""},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
       R"({"type":"string","pattern":"(?=a)b"}}})",
       "response_format", "'pattern' at $: unsupported regex syntax '(?=' (lookahead)"},
      {R"("guided_regex":"(a")", "guided_regex", "missing ')' at offset 2"},
      {R"("guided_regex":"a\\1")", "guided_regex", "backreference"},
      {R"("guided_regex":["a"])", "guided_regex", "must be a string"},
      {R"("guided_regex":"a","guided_choice":["a"])", "guided_regex", "only one of"},
      {R"("guided_json":{"properties":{"d":{"type":"string","format":"date"}}})", "guided_json",
       "'format' at $.properties.d"},
      {R"("guided_json":3)", "guided_json", "must be a JSON Schema"},
      {R"("guided_choice":"a")", "guided_choice", "list of strings"},
      {R"("guided_choice":[])", "guided_choice", "1 to 64"},
      {R"("guided_choice":["a"],"guided_json":{})", "guided_choice", "only one of"},
  };
  for (const Case& c : cases) {
    const std::string body = R"({"prompt":"x",)" + c.fields + "}";
    ApiError e = parse_error(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, c.param) << body;
    EXPECT_NE(e.message.find(c.message), std::string::npos) << body << " -> " << e.message;
  }
}

TEST(OpenAiProtocolTest, BestOfIsAtLeastNAndNotStreamedAboveIt) {
  GenerationRequest r = parse_ok(R"({"prompt":"x","n":2,"best_of":5})");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  ASSERT_TRUE(r.sampling.logprobs.has_value());  // asked of the engine to rank the choices
  EXPECT_FALSE(r.want_logprobs);                 // but not returned
  r = parse_ok(R"({"prompt":"x","n":3})");
  EXPECT_EQ(r.best_of, 3);
  EXPECT_FALSE(r.sampling.logprobs.has_value());
  r = parse_ok(R"({"prompt":"x","best_of":3,"logprobs":2})");
  EXPECT_EQ(*r.sampling.logprobs, 2);
  for (const char* body : {R"({"prompt":"x","n":3,"best_of":2})", R"({"prompt":"x","best_of":0})",
                           R"({"prompt":"x","best_of":200})", R"({"prompt":"x","best_of":"2"})",
                           R"({"prompt":"x","best_of":2,"stream":true})"}) {
    ApiError e = parse_error(body);
    EXPECT_EQ(e.param, "best_of") << body << " -> " << e.message;
  }
}

TEST(OpenAiProtocolTest, UnimplementedFieldsAreRefusedByName) {
  const char* refused[] = {
      R"("use_beam_search":true)",
      R"("length_penalty":0.5)",
      R"("functions":[{"name":"f"}])",
      R"("function_call":"auto")",
      R"("documents":[])",
      R"("mm_processor_kwargs":{"fps":1})",
      R"("guided_grammar":"root ::= \"a\"")",
      R"("structured_outputs":{"regex":"a"})",
      R"("allowed_token_ids":[1,2])",
      R"("bad_words":["x"])",
      R"("prompt_logprobs":0)",
      R"("return_tokens_as_token_ids":true)",
      R"("truncate_prompt_tokens":5)",
      R"("priority":1)",
      R"("cache_salt":"tenant")",
      R"("suffix":"end")",
      R"("prediction":{"type":"content","content":"x"})",
      R"("audio":{"voice":"alloy"})",
      R"("modalities":["text","audio"])",
      R"("reasoning_effort":"low")",
      R"("web_search_options":{})",
      R"("logits_processors":["my.module:Processor"])",
      R"("prompt_embeds":"AAAA")",
      R"("return_token_ids":true)",
      R"("vllm_xargs":{"k":1})",
  };
  for (const char* field : refused) {
    const std::string_view quoted(field);
    const std::string name(quoted.substr(1, quoted.find('"', 1) - 1));
    for (auto [endpoint, head] :
         {std::pair{Endpoint::kCompletions, R"({"prompt":"x",)"},
          std::pair{Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],)"}}) {
      std::string body = head;
      body.append(field).append("}");
      ApiError e = parse_error(body, endpoint);
      EXPECT_EQ(e.http_status, 400) << body;
      EXPECT_EQ(e.param, name) << body;
      EXPECT_NE(e.message.find("'" + name + "' is not supported"), std::string::npos)
          << body << " -> " << e.message;
    }
  }
  // The values that ask for nothing are accepted.
  parse_ok(R"({"prompt":"x","best_of":1,"use_beam_search":false,"length_penalty":1,
      "response_format":{"type":"text"},"tools":[],"tool_choice":"none","functions":null,
      "function_call":"none","chat_template":null,"chat_template_kwargs":{},
      "continue_final_message":false,"mm_processor_kwargs":{},"guided_json":null,
      "guided_regex":null,"guided_choice":null,"guided_grammar":null,"bad_words":[],
      "prompt_logprobs":null,"return_tokens_as_token_ids":false,"priority":0,"suffix":"",
      "modalities":["text"],"add_special_tokens":true,"user":"u","n":1})");
  parse_ok(R"({"messages":[{"role":"user","content":"x"}],"best_of":null,"tools":null,
      "tool_choice":null,"add_special_tokens":false})",
           Endpoint::kChat);
  // add_special_tokens only at what each endpoint does.
  EXPECT_EQ(parse_error(R"({"prompt":"x","add_special_tokens":false})").param,
            "add_special_tokens");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"add_special_tokens":true})",
                        Endpoint::kChat)
                .param,
            "add_special_tokens");
}

// Tool calls and their results reach the template in the OpenAI shape, arguments parsed into
// an object in their order (as vLLM passes them); the deprecated function-calling shape stays
// refused.
TEST(OpenAiProtocolTest, ToolMessagesReachTheTemplate) {
  auto r = parse_ok(R"({"messages":[{"role":"developer","content":"d"},
      {"role":"user","content":"x"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"z\":1,\"a\":[2]}"}},
                    {"id":"d","type":"function","function":{"name":"g","arguments":""}}]},
      {"role":"tool","tool_call_id":"c","name":"f","content":"42"}]})",
                    Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "developer");
  EXPECT_TRUE(r.messages[0].fields.empty());
  EXPECT_EQ(r.messages[2].content, "");
  const auto& calls = r.messages[2].fields["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["id"], "c");
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");
  EXPECT_EQ(calls[1]["function"]["arguments"].dump(), "{}");
  EXPECT_EQ(r.messages[3].fields.dump(), R"({"tool_call_id":"c","name":"f"})");
  // An assistant message with an empty or null tool_calls is a plain message.
  r = parse_ok(R"({"messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":"y","tool_calls":[]},
      {"role":"assistant","content":"z","tool_calls":null}]})",
               Endpoint::kChat);
  EXPECT_TRUE(r.messages[1].fields.empty());
  EXPECT_TRUE(r.messages[2].fields.empty());

  const std::pair<const char*, const char*> refused[] = {
      {R"({"messages":[{"role":"function","name":"f","content":"42"}]})", "role 'function'"},
      {R"({"messages":[{"role":"assistant","content":"",
          "function_call":{"name":"f","arguments":"{}"}}]})",
       "'function_call'"},
      {R"({"messages":[{"role":"user","content":"",
          "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]})",
       "only allowed in assistant messages"},
      {R"({"messages":[{"role":"assistant","content":"","tool_calls":{}}]})", "must be a list"},
      {R"({"messages":[{"role":"assistant","content":"","tool_calls":[{"id":"c"}]}]})",
       "\"function\""},
      {R"({"messages":[{"role":"assistant","content":"",
          "tool_calls":[{"function":{"name":"f","arguments":"{nope"}}]}]})",
       "'arguments' is not valid JSON"},
      {R"({"messages":[{"role":"tool","tool_call_id":5,"content":"42"}]})", "'tool_call_id'"},
  };
  for (const auto& [body, want] : refused) {
    ApiError e = parse_error(body, Endpoint::kChat);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_NE(e.message.find(want), std::string::npos) << body << " -> " << e.message;
  }
}

TEST(OpenAiProtocolTest, ChatTemplateFields) {
  auto r = parse_ok(R"({"messages":[{"role":"user","content":"x"}]})", Endpoint::kChat);
  EXPECT_TRUE(r.chat_render.add_generation_prompt);
  EXPECT_FALSE(r.chat_render.continue_final_message);
  EXPECT_FALSE(r.chat_render.chat_template.has_value());
  EXPECT_TRUE(r.chat_render.template_kwargs.empty());
  EXPECT_TRUE(r.chat_render.tools.is_null());

  r = parse_ok(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],
      "add_generation_prompt":false,"continue_final_message":true,
      "chat_template":"{{ messages[0].content }}",
      "chat_template_kwargs":{"enable_thinking":false,"n":{"k":1}}})",
               Endpoint::kChat);
  EXPECT_FALSE(r.chat_render.add_generation_prompt);
  EXPECT_TRUE(r.chat_render.continue_final_message);
  EXPECT_EQ(r.chat_render.chat_template.value(), "{{ messages[0].content }}");
  EXPECT_EQ(r.chat_render.template_kwargs.dump(), R"({"enable_thinking":false,"n":{"k":1}})");
  // "" is the model's template, as in vLLM.
  r = parse_ok(R"({"messages":[{"role":"user","content":"x"}],"chat_template":""})",
               Endpoint::kChat);
  EXPECT_FALSE(r.chat_render.chat_template.has_value());

  const std::tuple<const char*, const char*, const char*> refused[] = {
      // add_generation_prompt defaults to true, as in vLLM.
      {R"({"messages":[{"role":"assistant","content":"y"}],"continue_final_message":true})",
       "continue_final_message", "'add_generation_prompt' cannot both be true"},
      {R"({"messages":[{"role":"user","content":"y"}],"continue_final_message":true,
          "add_generation_prompt":false})",
       "continue_final_message", "final message to be an assistant's"},
      {R"({"messages":[{"role":"user","content":"y"}],"chat_template":7})", "chat_template",
       "must be a string"},
      {R"({"messages":[{"role":"user","content":"y"}],"chat_template_kwargs":[1]})",
       "chat_template_kwargs", "must be an object"},
      {R"({"messages":[{"role":"user","content":"y"}],"chat_template_kwargs":{"messages":[]}})",
       "chat_template_kwargs", "must not set 'messages'"},
      {R"({"messages":[{"role":"user","content":"y"}],"chat_template_kwargs":{"tools":[]}})",
       "chat_template_kwargs", "must not set 'tools'"},
      {R"({"messages":[{"role":"user","content":"y"}],"continue_final_message":1})",
       "continue_final_message", "must be a boolean"},
  };
  for (const auto& [body, param, want] : refused) {
    ApiError e = parse_error(body, Endpoint::kChat);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(want), std::string::npos) << body << " -> " << e.message;
  }
  // The chat-only fields on /v1/completions: a 400 naming them unless they ask for nothing.
  for (const char* field : {R"("chat_template":"x")", R"("chat_template_kwargs":{"a":1})",
                            R"("continue_final_message":true)", R"("tool_choice":"auto")",
                            R"("tools":[{"type":"function","function":{"name":"f"}}])"}) {
    const std::string body = std::string(R"({"prompt":"x",)") + field + "}";
    ApiError e = parse_error(body);
    EXPECT_NE(e.message.find("applies only to /v1/chat/completions"), std::string::npos)
        << body << " -> " << e.message;
  }
}

// The tools reach the template in the order the client wrote them, whatever tool_choice says;
// tool_choice follows vLLM's rules ("auto" when tools are given without it).
TEST(OpenAiProtocolTest, ToolsReachTheTemplateAndToolChoiceFollowsVllm) {
  auto r = parse_ok(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}]})",
                    Endpoint::kChat);
  ASSERT_TRUE(r.chat_render.tools.is_array());
  EXPECT_EQ(r.chat_render.tools[0]["function"]["parameters"]["properties"].dump(),
            R"({"z":{"type":"string"},"a":{"type":"integer"}})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNone);
  EXPECT_TRUE(parse_ok(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
      "tools":[]})",
                       Endpoint::kChat)
                  .chat_render.tools.is_null());

  const std::pair<const char*, ToolChoice> accepted[] = {
      {R"("tools":[{"type":"function","function":{"name":"f"}}])", ToolChoice::kAuto},
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto")",
       ToolChoice::kAuto},
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":null)",
       ToolChoice::kAuto},
      {R"("tools":[],"tool_choice":"auto")", ToolChoice::kNone},
      {R"("tools":[],"tool_choice":"required")", ToolChoice::kNone},
      {R"("tools":[])", ToolChoice::kNone},
      {R"("tool_choice":"none")", ToolChoice::kNone},
  };
  for (const auto& [fields, want] : accepted) {
    const std::string body =
        std::string(R"({"messages":[{"role":"user","content":"x"}],)") + fields + "}";
    EXPECT_EQ(parse_ok(body, Endpoint::kChat).tool_choice, want) << body;
  }

  const std::tuple<const char*, Endpoint, const char*, const char*> refused[] = {
      {R"({"prompt":"x","tool_choice":"none",
          "tools":[{"type":"function","function":{"name":"f"}}]})",
       Endpoint::kCompletions, "tools", "applies only to"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
          "tools":[{"type":"function","function":{}}]})",
       Endpoint::kChat, "tools", "each tool must be"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tools":[{"type":"function","function":{"name":""}}]})",
       Endpoint::kChat, "tools", "each tool must be"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tools":[{"type":"retrieval","function":{"name":"f"}}]})",
       Endpoint::kChat, "tools", "each tool must be"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}]})",
       Endpoint::kChat, "tools", "'parameters' must be a JSON Schema object"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none","tools":{}})",
       Endpoint::kChat, "tools", "must be a list"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", Endpoint::kChat,
       "tool_choice", "needs 'tools'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes",
          "tools":[{"type":"function","function":{"name":"f"}}]})",
       Endpoint::kChat, "tool_choice", "must be \"none\""},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
          "tools":[{"type":"function","function":{"name":"f"}},
                   {"type":"function","function":{"name":"f"}}]})",
       Endpoint::kChat, "tool_choice", "two tools are named 'f'"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},
          "tool_choice":{"type":"function","function":{"name":"f"}},
          "tools":[{"type":"function","function":{"name":"f"}}]})",
       Endpoint::kChat, "tool_choice", "cannot be combined with 'response_format'"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tool_choice":{"type":"function","function":{"name":"f"}},
          "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
            "properties":{"s":{"type":"string","format":"date"}}}}}]})",
       Endpoint::kChat, "tool_choice", "unsupported JSON Schema keyword 'format'"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tool_choice":{"type":"function","function":{"name":"g"}},
          "tools":[{"type":"function","function":{"name":"f"}}]})",
       Endpoint::kChat, "tool_choice", "'g', which is not in 'tools'"},
  };
  for (const auto& [body, endpoint, param, want] : refused) {
    ApiError e = parse_error(body, endpoint);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(want), std::string::npos) << body << " -> " << e.message;
  }
}

TEST(OpenAiProtocolTest, MalformedJsonAndInvalidUtf8) {
  EXPECT_NE(parse_error("{\"prompt\": ").message.find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("{\"prompt\": \"\xff\xfe\"}").message.find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(parse_error("[1,2]").message.find("object"), std::string::npos);
}

TEST(OpenAiProtocolTest, NumberOverflowIsABadRequest) {
  ApiError e = parse_error(R"({"model":"x","prompt":"a","max_tokens":1e400})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.message,
            "the request body has a number out of range at line 1, column 40: 1e400 does not fit "
            "in a double (largest magnitude about 1.8e308)");
  e = parse_error(R"({"prompt":"a","logit_bias":{"5":-1e400}})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("-1e400 does not fit in a double"), std::string::npos) << e.message;
}

TEST(OpenAiProtocolTest, ErrorShape) {
  auto j = error_json(bad_request("bad", "max_tokens"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(j["error"]["code"], 400);  // an integer, as vLLM writes it
  auto unauthorized = error_json(api_error(401, "no key", "authentication_error"));
  EXPECT_EQ(unauthorized["error"]["code"], 401);
  EXPECT_TRUE(unauthorized["error"]["param"].is_null());
}

TEST(OpenAiProtocolTest, DumpReplacesInvalidUtf8) {
  nlohmann::json j = {{"text", std::string("a\xff")}};
  EXPECT_EQ(dump_json(j), "{\"text\":\"a\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace crescent::server
