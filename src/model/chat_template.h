#pragma once
// Chat templates: recognises the family of a model's Jinja `chat_template` (from
// tokenizer_config.json) and renders conversations natively in C++, producing exactly what the
// Jinja template produces for system/user/assistant (and, for Qwen3, tool) messages. Supported:
// Qwen3 (ChatML with <think> handling) and Llama-3 (header ids). Anything else is refused with
// Unimplemented. Immutable after construction; thread-safe.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::model {

struct ChatMessage {
  std::string role;
  std::string content;
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

enum class ChatTemplateFamily { kQwen3, kLlama3 };

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Qwen3's `enable_thinking`: unset leaves it undefined in the template; false appends an
  // empty <think></think> block after the generation prompt.
  std::optional<bool> enable_thinking;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_tokenizer_config_file(const std::string& path);
  static Result<ChatTemplate> from_tokenizer_config_json(std::string_view json);
  // Recognises the family of `jinja` (the chat_template text).
  static Result<ChatTemplate> from_config(TokenizerConfig config);

  // Unknown roles are InvalidArgument.
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

  ChatTemplateFamily family_;
  TokenizerConfig config_;
  // Llama-3: whether the template guards the assistant header with add_generation_prompt
  // (the original Llama-3 template emits it unconditionally).
  bool llama3_conditional_prompt_ = true;
};

}  // namespace crescent::model
