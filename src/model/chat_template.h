#pragma once
// Chat templates: recognises the family of a model's Jinja `chat_template` (from
// tokenizer_config.json) and renders conversations natively in C++, producing exactly what the
// Jinja template produces for system/user/assistant (and, for Qwen3 and Qwen2-VL, tool) messages.
// Supported: Qwen3 (ChatML with <think> handling), Llama-3 (header ids) and Qwen2-VL /
// Qwen2.5-VL (ChatML with a default system prompt and image placeholders). Anything else is
// refused with Unimplemented. Immutable after construction; thread-safe.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

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
  // Empty for a plain string content. Otherwise the content in order, images included; a
  // template that iterates over parts renders these, the others render `content` and refuse
  // images.
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

enum class ChatTemplateFamily { kQwen3, kLlama3, kQwen2Vl };

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Qwen3's `enable_thinking`: unset leaves it undefined in the template; false appends an
  // empty <think></think> block after the generation prompt.
  std::optional<bool> enable_thinking;
  // Qwen2-VL's `add_vision_id`: prefixes each image placeholder with "Picture N: " (N counts
  // the images of the whole conversation from 1).
  bool add_vision_id = false;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_tokenizer_config_file(const std::string& path);
  static Result<ChatTemplate> from_tokenizer_config_json(std::string_view json);
  // Recognises the family of `jinja` (the chat_template text).
  static Result<ChatTemplate> from_config(TokenizerConfig config);

  // Unknown roles are InvalidArgument, and so are images for a family whose template renders
  // string contents only (Qwen3, Llama-3).
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& options) const;

  ChatTemplateFamily family() const { return family_; }
  const TokenizerConfig& config() const { return config_; }
  const std::optional<std::string>& bos_token() const { return config_.bos_token; }
  const std::optional<std::string>& eos_token() const { return config_.eos_token; }

 private:
  ChatTemplate(ChatTemplateFamily family, TokenizerConfig config)
      : family_(family), config_(std::move(config)) {}
  Result<std::string> render_qwen3(const std::vector<ChatMessage>& messages,
                                   const ChatRenderOptions& options) const;
  Result<std::string> render_llama3(const std::vector<ChatMessage>& messages,
                                    const ChatRenderOptions& options) const;
  Result<std::string> render_qwen2_vl(const std::vector<ChatMessage>& messages,
                                      const ChatRenderOptions& options) const;

  ChatTemplateFamily family_;
  TokenizerConfig config_;
  // Llama-3: whether the template guards the assistant header with add_generation_prompt
  // (the original Llama-3 template emits it unconditionally).
  bool llama3_conditional_prompt_ = true;
  // Qwen2-VL: the system prompt the template inserts when the first message is not a system
  // one (read from the template, so fine-tunes that change it render right), and whether the
  // template knows add_vision_id.
  std::string qwen2_vl_default_system_;
  bool qwen2_vl_has_vision_id_ = false;
};

}  // namespace crescent::model
