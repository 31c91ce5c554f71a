#pragma once
// The tokenizer `crescent bench serve` makes prompts with and counts tokens with: the served
// model's own tokenizer read from disk (tokenizer.json, a model directory or a .gguf), or the
// server's, asked through its /tokenize and /detokenize endpoints (vLLM's shapes, or
// llama.cpp server's), so that a benchmark needs no local copy of the model.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"

namespace crescent::bench {

class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;

  virtual Result<std::vector<int32_t>> encode(std::string_view text,
                                              bool add_special_tokens) const = 0;
  virtual Result<std::string> decode(std::span<const int32_t> ids) const = 0;
  // Ids that are text on their own (not special, decoding to whole characters next to any
  // neighbour), in increasing order: random prompts are drawn from them.
  virtual Result<std::vector<int32_t>> text_token_ids() const = 0;
  // The range random offsets into text_token_ids() are drawn from (the vocabulary's size for
  // a local tokenizer, so that its prompts stay those of earlier versions for one seed).
  [[nodiscard]] virtual int64_t offset_range() const = 0;
  // Where the tokenizer came from, for the result's tokenizer_id.
  [[nodiscard]] virtual std::string source() const = 0;
};

// Wraps a loaded tokenizer; `source` is the path it came from.
std::unique_ptr<PromptTokenizer> local_prompt_tokenizer(std::shared_ptr<const model::Tokenizer> tok,
                                                        std::string source);

// Loads tokenizer.json, a model directory or a .gguf (model::open_tokenizer).
Result<std::unique_ptr<PromptTokenizer>> open_local_prompt_tokenizer(const std::string& path);

}  // namespace crescent::bench
