#pragma once
// Tokenizer: a HuggingFace `tokenizer.json` BPE tokenizer, both byte-level (GPT-2, Llama-3,
// Qwen2/Qwen3) and SentencePiece-style with byte fallback (Llama-2/Mistral). Added and special
// tokens are matched in the raw text before normalisation and BPE. Anything in the file this
// implementation does not handle exactly is refused at load with an error naming the feature.
//
// A Tokenizer is immutable after loading; all const methods are thread-safe (the word cache is
// internally synchronised). StreamingDetokenizer is a per-sequence object: not thread-safe,
// and it must not outlive its Tokenizer.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::model {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_file(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 text; invalid UTF-8 is InvalidArgument. add_special_tokens applies the
  // post_processor's template (e.g. a BOS token) when the file has one.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const;

  // Decodes ids as HF tokenizers' decode() does; ids outside the vocabulary are skipped.
  // Invalid byte sequences decode to U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Max id + 1, added tokens included.
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of `id` (byte-level form for byte-level tokenizers); "" if unknown.
  std::string id_to_token(int32_t id) const;
  // The bytes `id` contributes to decoded text when it follows other tokens (byte-level bytes,
  // a byte-fallback byte, or the piece with its decoder replacements); "" for special and
  // unknown ids. Guided decoding matches these against a grammar.
  std::string token_bytes(int32_t id) const;
  // True for added tokens marked "special" in tokenizer.json.
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  friend class StreamingDetokenizer;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of generated ids into text pieces. The concatenation of every push() and the
// final flush() equals tokenizer.decode(all ids, skip_special_tokens). push() never returns
// part of a UTF-8 character: incomplete bytes are held until completed (or until flush()).
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  ~StreamingDetokenizer();
  StreamingDetokenizer(StreamingDetokenizer&&) noexcept;
  StreamingDetokenizer& operator=(StreamingDetokenizer&&) noexcept;

  // Returns the text completed by `id` (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is still held (incomplete bytes decode to U+FFFD) and resets the state.
  std::string flush();

  struct State;

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::unique_ptr<State> state_;
};

}  // namespace crescent::model
