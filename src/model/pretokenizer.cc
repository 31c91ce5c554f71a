#include "model/pretokenizer.h"

#include <cstdint>

#include "core/check.h"
#include "model/unicode.h"

namespace crescent::model {
namespace {

constexpr uint8_t kLetter = 1;
constexpr uint8_t kNumber = 2;
constexpr uint8_t kSpace = 4;
constexpr uint8_t kCrLf = 8;

struct Chars {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<size_t> offset;  // byte offset of each code point, plus one past the end
};

void classify(std::string_view text, Chars* c) {
  c->cp.clear();
  c->cls.clear();
  c->offset.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    c->offset.push_back(pos);
    const char32_t cp = unicode::next_code_point(text, &pos);
    uint8_t cls = 0;
    if (unicode::is_letter(cp)) {
      cls = kLetter;
    } else if (unicode::is_number(cp)) {
      cls = kNumber;
    } else if (unicode::is_whitespace(cp)) {
      cls = kSpace;
      if (cp == '\r' || cp == '\n') {
        cls |= kCrLf;
      }
    }
    c->cp.push_back(cp);
    c->cls.push_back(cls);
  }
  c->offset.push_back(text.size());
}

// Simple case folding restricted to the letters of the contractions ('s 't 're 've 'm 'll 'd):
// U+017F LATIN SMALL LETTER LONG S folds to 's' under Unicode case-insensitive matching.
char32_t fold(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') {
    return cp + 32;
  }
  if (cp == 0x017F) {
    return 's';
  }
  return cp;
}

// Length (in code points) of a contraction match at i, or 0.
size_t match_contraction(const Chars& c, size_t i, bool ignore_case) {
  const size_t n = c.cp.size();
  if (c.cp[i] != '\'' || i + 1 >= n) {
    return 0;
  }
  auto f = [&](size_t k) { return ignore_case ? fold(c.cp[k]) : c.cp[k]; };
  const char32_t a = f(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') {
    return 2;
  }
  if (i + 2 < n) {
    const char32_t b = f(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
      return 3;
    }
  }
  return 0;
}

bool is_other(uint8_t cls) {
  return (cls & (kLetter | kNumber | kSpace)) == 0;
}

size_t run(const Chars& c, size_t j, uint8_t mask) {
  while (j < c.cls.size() && (c.cls[j] & mask) != 0) {
    ++j;
  }
  return j;
}

size_t run_other(const Chars& c, size_t j) {
  while (j < c.cls.size() && is_other(c.cls[j])) {
    ++j;
  }
  return j;
}

// Whitespace alternatives shared by all patterns: [\s*[\r\n]+ |] \s+(?!\S) | \s+ .
size_t match_whitespace(const Chars& c, size_t i, bool crlf_rule) {
  const size_t n = c.cp.size();
  const size_t e = run(c, i, kSpace);
  if (crlf_rule) {
    for (size_t k = e; k > i; --k) {
      if (c.cls[k - 1] & kCrLf) {
        return k - i;
      }
    }
  }
  if (e == n || e - i < 2) {
    return e - i;
  }
  return e - i - 1;
}

size_t match_llama_qwen(const Chars& c, size_t i, size_t max_digits) {
  const size_t n = c.cp.size();
  const uint8_t cls = c.cls[i];
  if (size_t m = match_contraction(c, i, /*ignore_case=*/true)) {
    return m;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls & kLetter) {
    return run(c, i + 1, kLetter) - i;
  }
  if ((cls & (kCrLf | kNumber)) == 0 && i + 1 < n && (c.cls[i + 1] & kLetter)) {
    return run(c, i + 2, kLetter) - i;
  }
  // \p{N}{1,max}
  if (cls & kNumber) {
    size_t j = i + 1;
    while (j < n && j - i < max_digits && (c.cls[j] & kNumber)) {
      ++j;
    }
    return j - i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = i;
  if (c.cp[i] == ' ' && i + 1 < n && is_other(c.cls[i + 1])) {
    start = i + 1;
  }
  if (is_other(c.cls[start])) {
    const size_t j = run_other(c, start);
    return run(c, j, kCrLf) - i;
  }
  return match_whitespace(c, i, /*crlf_rule=*/true);
}

size_t match_gpt2(const Chars& c, size_t i) {
  const size_t n = c.cp.size();
  if (size_t m = match_contraction(c, i, /*ignore_case=*/false)) {
    return m;
  }
  const size_t start = (c.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  const uint8_t cls = c.cls[start];
  if (start == i + 1 || cls != kSpace) {
    if (cls & kLetter) {
      return run(c, start + 1, kLetter) - i;
    }
    if (cls & kNumber) {
      return run(c, start + 1, kNumber) - i;
    }
    if (is_other(cls)) {
      return run_other(c, start + 1) - i;
    }
  }
  return match_whitespace(c, i, /*crlf_rule=*/false);
}

}  // namespace

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case SplitPattern::kLlama3:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case SplitPattern::kQwen2:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  }
  return "";
}

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    if (regex == split_pattern_regex(p))
      return p;
  }
  return std::nullopt;
}

void split_with_pattern(SplitPattern pattern, std::string_view text,
                        std::vector<std::pair<size_t, size_t>>* pieces) {
  thread_local Chars c;
  classify(text, &c);
  const size_t n = c.cp.size();
  size_t i = 0;
  while (i < n) {
    size_t m = 0;
    switch (pattern) {
      case SplitPattern::kGpt2:
        m = match_gpt2(c, i);
        break;
      case SplitPattern::kLlama3:
        m = match_llama_qwen(c, i, 3);
        break;
      case SplitPattern::kQwen2:
        m = match_llama_qwen(c, i, 1);
        break;
    }
    CRESCENT_CHECK(m > 0) << "pre-tokenizer matched nothing";
    pieces->emplace_back(c.offset[i], c.offset[i + m]);
    i += m;
  }
}

}  // namespace crescent::model
