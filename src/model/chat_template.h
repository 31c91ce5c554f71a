#pragma once
// Chat templates: a model's Jinja `chat_template` (from tokenizer_config.json, or given by the
// user) rendered as transformers' apply_chat_template renders it, through crescent's Jinja2
// engine (model/jinja): same variables (messages, tools, add_generation_prompt, the special
// tokens, extra kwargs), same output byte for byte. Template errors, raise_exception included,
// are InvalidArgument. Immutable after construction; thread-safe.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/jinja/template.h"

namespace crescent::model {

// One piece of a message's content as the OpenAI parts list gives it: text, or an image (whose
// pixels travel beside the prompt; the template renders only its placeholder).
struct ChatContentPart {
  bool is_image = false;
  std::string text;  // text parts only
};

struct ChatMessage {
  std::string role;
  // The text of the message; when `parts` is set, its text parts concatenated.
  std::string content;
  // Empty for a plain string content. Otherwise the content in order, images included. Text-only
  // parts reach the template as the string `content`; with images, as transformers passes them:
  // a list of {"type": "image"} and {"type": "text", "text": ...} (a template that never
  // mentions images refuses them).
  // (The "= {}" keeps {role, content} a complete initializer under -Wextra.)
  std::vector<ChatContentPart> parts = {};

  bool has_images() const;
};

// The fields of tokenizer_config.json that the engine needs.
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::string chat_template;  // "" if the file has none

  static Result<TokenizerConfig> from_file(const std::string& path);
  static Result<TokenizerConfig> from_json(std::string_view json);
};

// The family a template looks like (for logs and heuristics; rendering never depends on it).
enum class ChatTemplateFamily { kQwen3, kLlama3, kQwen2Vl, kOther };

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Qwen3's `enable_thinking`: unset leaves it undefined in the template; false appends an
  // empty <think></think> block after the generation prompt.
  std::optional<bool> enable_thinking;
  // Qwen2-VL's `add_vision_id`: prefixes each image placeholder with "Picture N: " (N counts
  // the images of the whole conversation from 1).
  bool add_vision_id = false;
  // transformers' continue_final_message: the output ends right after the final message's text
  // (no end-of-turn tokens), for the model to continue it. Exclusive with add_generation_prompt.
  bool continue_final_message = false;
  // OpenAI `tools` (a JSON list) as the template's `tools`; null renders as None.
  nlohmann::ordered_json tools = nullptr;
  // Extra template variables (vLLM's `chat_template_kwargs`), a JSON object; they override the
  // special tokens and the options above.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_tokenizer_config_file(const std::string& path);
  static Result<ChatTemplate> from_tokenizer_config_json(std::string_view json);
  // Parses the chat_template text; a syntax error is InvalidArgument naming the line.
  static Result<ChatTemplate> from_config(TokenizerConfig config);
  // `config` with its chat_template replaced by `jinja` (a request's or --chat-template's).
  static Result<ChatTemplate> from_template(std::string jinja, TokenizerConfig config);

  // Roles other than system/user/assistant/tool are InvalidArgument unless the template names
  // them (e.g. 'developer'); so are images for a template that never mentions images.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& options) const;
  // OpenAI-shaped messages (a JSON list of objects with role, content — a string, null or a
  // parts list — and whatever else the template reads: tool_calls, tool_call_id,
  // reasoning_content...), passed to the template as they are.
  Result<std::string> render_json(const nlohmann::ordered_json& messages,
                                  const ChatRenderOptions& options) const;

  ChatTemplateFamily family() const { return family_; }
  const TokenizerConfig& config() const { return config_; }
  const std::optional<std::string>& bos_token() const { return config_.bos_token; }
  const std::optional<std::string>& eos_token() const { return config_.eos_token; }

 private:
  ChatTemplate(ChatTemplateFamily family, TokenizerConfig config, jinja::Template compiled)
      : family_(family), config_(std::move(config)), compiled_(std::move(compiled)) {}

  ChatTemplateFamily family_;
  TokenizerConfig config_;
  jinja::Template compiled_;
};

}  // namespace crescent::model
