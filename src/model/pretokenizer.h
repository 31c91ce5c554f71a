#pragma once
// Hand-written, exact matchers for the pre-tokenizer regexes of GPT-2, Llama-3 and Qwen2/Qwen3
// (HF `Split` with behaviour Isolated). A matcher splits UTF-8 text into the byte ranges that
// repeated leftmost-first regex matching would produce, with the Unicode classes of
// unicode.h. Stateless and thread-safe.

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace crescent::model {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} (single digits) instead of \p{N}{1,3}.
  kQwen2,
};

// Recognises one of the supported regexes by its exact source text.
std::optional<SplitPattern> recognize_split_pattern(std::string_view regex);
// The regex source text of `pattern`, as tokenizer.json's Split pre-tokenizer writes it.
std::string_view split_pattern_regex(SplitPattern pattern);

// Appends [begin, end) byte ranges of `text` (valid UTF-8) covering it completely, in order.
void split_with_pattern(SplitPattern pattern, std::string_view text,
                        std::vector<std::pair<size_t, size_t>>* pieces);

}  // namespace crescent::model
