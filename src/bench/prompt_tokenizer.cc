#include "bench/prompt_tokenizer.h"

#include <utility>

#include "model/model_files.h"

namespace crescent::bench {

namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

class LocalPromptTokenizer final : public PromptTokenizer {
 public:
  LocalPromptTokenizer(std::shared_ptr<const model::Tokenizer> tok, std::string source)
      : tok_(std::move(tok)), source_(std::move(source)) {}

  Result<std::vector<int32_t>> encode(std::string_view text,
                                      bool add_special_tokens) const override {
    return tok_->encode(text, add_special_tokens);
  }
  Result<std::string> decode(std::span<const int32_t> ids) const override {
    return tok_->decode(ids);
  }
  // Tokens that are not text on their own (a byte-fallback <0xE3>, half of a character in a
  // byte-level vocabulary) decode to U+FFFD next to arbitrary neighbours, which re-encodes to
  // a different number of tokens and makes a prompt's length drift: they are left out.
  Result<std::vector<int32_t>> text_token_ids() const override {
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < tok_->vocab_size(); ++id) {
      if (tok_->is_special(id) || tok_->id_to_token(id).empty()) {
        continue;
      }
      std::string text = tok_->decode(std::span<const int32_t>(&id, 1));
      if (!text.empty() && text.find(kReplacementCharacter) == std::string::npos) {
        ids.push_back(id);
      }
    }
    return ids;
  }
  [[nodiscard]] int64_t offset_range() const override { return tok_->vocab_size(); }
  [[nodiscard]] std::string source() const override { return source_; }

 private:
  std::shared_ptr<const model::Tokenizer> tok_;
  std::string source_;
};

}  // namespace

std::unique_ptr<PromptTokenizer> local_prompt_tokenizer(std::shared_ptr<const model::Tokenizer> tok,
                                                        std::string source) {
  return std::make_unique<LocalPromptTokenizer>(std::move(tok), std::move(source));
}

Result<std::unique_ptr<PromptTokenizer>> open_local_prompt_tokenizer(const std::string& path) {
  auto tok = model::open_tokenizer(path);
  if (!tok.is_ok()) {
    return tok.status().with_context("loading the tokenizer of " + path);
  }
  return local_prompt_tokenizer(std::shared_ptr<const model::Tokenizer>(std::move(*tok)), path);
}

}  // namespace crescent::bench
