#pragma once
// Adapts model::StreamingDetokenizer (UTF-8-safe incremental decoding) to the engine's
// Detokenizer interface. The tokenizer must outlive every detokenizer made from it.

#include <memory>

#include "engine/detokenizer.h"
#include "model/tokenizer.h"

namespace crescent::engine {

class TokenizerDetokenizer : public Detokenizer {
 public:
  TokenizerDetokenizer(const model::Tokenizer& tokenizer, bool skip_special_tokens)
      : inner_(tokenizer, skip_special_tokens) {}
  std::string push(int32_t token_id) override { return inner_.push(token_id); }
  std::string flush() override { return inner_.flush(); }

 private:
  model::StreamingDetokenizer inner_;
};

}  // namespace crescent::engine
