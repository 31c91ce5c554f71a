#include "engine/guided/regex_parse.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "engine/guided/regex.h"

namespace crescent::engine::guided::regex_internal {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

CodeSet normalized(CodeSet set) {
  std::sort(set.begin(), set.end(),
            [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  CodeSet out;
  for (const CodeRange& r : set) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// Every code point (surrogates excluded) that is not in `set`.
CodeSet complement(const CodeSet& set) {
  CodeSet holes = normalized(set);
  holes.push_back({kSurrogateLo, kSurrogateHi});
  holes = normalized(std::move(holes));
  CodeSet out;
  uint32_t from = 0;
  for (const CodeRange& r : holes) {
    if (r.lo > from) {
      out.push_back({from, r.lo - 1});
    }
    from = r.hi + 1;
  }
  if (from <= kMaxCodePoint) {
    out.push_back({from, kMaxCodePoint});
  }
  return out;
}

CodeSet digit_set() {
  return {{'0', '9'}};
}
CodeSet word_set() {
  return normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
}
CodeSet space_set() {
  return normalized({{'\t', '\r'}, {' ', ' '}});
}

struct CodePoint {
  uint32_t value = 0;
  size_t offset = 0;  // of its first byte in the pattern
};

Result<std::vector<CodePoint>> decode_utf8(std::string_view text) {
  std::vector<CodePoint> out;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<uint8_t>(text[i]);
    int extra = b < 0x80                  ? 0
                : (b >= 0xC2 && b < 0xE0) ? 1
                : (b >= 0xE0 && b < 0xF0) ? 2
                : (b >= 0xF0 && b < 0xF5) ? 3
                                          : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= text.size() + (extra == 0 ? 1 : 0)) {
      return invalid_argument("the regex is not valid UTF-8 at offset " + std::to_string(i));
    }
    uint32_t cp = extra == 0 ? b : b & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto c = static_cast<uint8_t>(text[i + k]);
      if ((c & 0xC0) != 0x80) {
        return invalid_argument("the regex is not valid UTF-8 at offset " + std::to_string(i));
      }
      cp = cp << 6 | (c & 0x3F);
    }
    out.push_back({cp, i});
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

class Parser {
 public:
  explicit Parser(std::vector<CodePoint> text, size_t num_bytes)
      : text_(std::move(text)), num_bytes_(num_bytes) {}

  Result<Ast> parse() {
    ASSIGN_OR_RETURN(Ast ast, parse_alt(0));
    if (pos_ < text_.size()) {
      return error("unbalanced ')'");
    }
    return ast;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  uint32_t peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead].value : 0xFFFFFFFF;
  }
  size_t offset() const { return at_end() ? num_bytes_ : text_[pos_].offset; }
  Status error(const std::string& what) const {
    return invalid_argument(what + " at offset " + std::to_string(offset()));
  }
  Status unsupported(const std::string& syntax, const std::string& meaning) const {
    return invalid_argument("unsupported regex syntax '" + syntax + "' (" + meaning +
                            ") at offset " + std::to_string(offset()));
  }

  Result<Ast> parse_alt(int depth) {
    if (depth > 64) {
      return error("the regex nests groups too deeply");
    }
    Ast alt;
    alt.kind = Ast::Kind::kAlt;
    while (true) {
      ASSIGN_OR_RETURN(Ast branch, parse_concat(depth));
      alt.children.push_back(std::move(branch));
      if (peek() != '|') {
        break;
      }
      ++pos_;
    }
    if (alt.children.size() == 1) {
      return std::move(alt.children[0]);
    }
    return alt;
  }

  Result<Ast> parse_concat(int depth) {
    Ast concat;
    concat.kind = Ast::Kind::kConcat;
    while (!at_end() && peek() != '|' && peek() != ')') {
      ASSIGN_OR_RETURN(Ast item, parse_repeat(depth));
      concat.children.push_back(std::move(item));
    }
    return concat;
  }

  // {m}, {m,}, {m,n} or {,n} at pos_ (on '{'); nullopt (pos_ unchanged) when it is not one,
  // and then '{' is a literal, as in Python.
  std::optional<std::pair<int64_t, int64_t>> try_braces() {
    size_t p = pos_ + 1;
    auto number = [&](int64_t* out) {
      size_t start = p;
      int64_t v = 0;
      while (p < text_.size() && text_[p].value >= '0' && text_[p].value <= '9') {
        v = std::min<int64_t>(v * 10 + (text_[p].value - '0'), 1'000'000'000);
        ++p;
      }
      *out = v;
      return p > start;
    };
    int64_t lo = 0;
    int64_t hi = 0;
    const bool has_lo = number(&lo);
    if (p < text_.size() && text_[p].value == '}') {
      if (!has_lo) {
        return std::nullopt;
      }
      pos_ = p + 1;
      return std::make_pair(lo, lo);
    }
    if (p >= text_.size() || text_[p].value != ',') {
      return std::nullopt;
    }
    ++p;
    const bool has_hi = number(&hi);
    if (p >= text_.size() || text_[p].value != '}') {
      return std::nullopt;
    }
    pos_ = p + 1;
    return std::make_pair(has_lo ? lo : 0, has_hi ? hi : -1);
  }

  Result<Ast> parse_repeat(int depth) {
    ASSIGN_OR_RETURN(Ast atom, parse_atom(depth));
    bool repeated = false;
    while (!at_end()) {
      int64_t lo = 0;
      int64_t hi = -1;
      const size_t start = pos_;
      if (peek() == '*') {
        ++pos_;
      } else if (peek() == '+') {
        lo = 1;
        ++pos_;
      } else if (peek() == '?') {
        hi = 1;
        ++pos_;
      } else if (peek() == '{') {
        auto braces = try_braces();
        if (!braces.has_value()) {
          break;
        }
        std::tie(lo, hi) = *braces;
        if (lo > kMaxRegexRepeat || hi > kMaxRegexRepeat) {
          pos_ = start;
          return error("a repetition count is over " + std::to_string(kMaxRegexRepeat));
        }
        if (hi >= 0 && hi < lo) {
          pos_ = start;
          return error("min repeat greater than max repeat");
        }
      } else {
        break;
      }
      if (repeated) {
        pos_ = start;
        return error("multiple repeat");
      }
      repeated = true;
      if (peek() == '?') {
        ++pos_;  // lazy: the same language
      } else if (peek() == '+') {
        return unsupported("+", "possessive quantifier");
      }
      Ast rep;
      rep.kind = Ast::Kind::kRepeat;
      rep.min = static_cast<int>(lo);
      rep.max = static_cast<int>(hi);
      rep.children.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  static Ast set_of(CodeSet set) {
    Ast a;
    a.kind = Ast::Kind::kSet;
    a.set = normalized(std::move(set));
    return a;
  }

  Result<Ast> parse_atom(int depth) {
    const uint32_t c = peek();
    if (c == '(') {
      return parse_group(depth);
    }
    if (c == '[') {
      ++pos_;
      ASSIGN_OR_RETURN(CodeSet set, parse_class());
      return set_of(std::move(set));
    }
    if (c == '.') {
      ++pos_;
      return set_of(complement({{'\n', '\n'}}));
    }
    if (c == '^' || c == '$') {
      const bool ok = c == '^' ? pos_ == 0 : pos_ + 1 == text_.size();
      if (!ok) {
        return unsupported(c == '^' ? "^" : "$", "an anchor other than at the pattern's ends");
      }
      ++pos_;
      return Ast();
    }
    if (c == '*' || c == '+' || c == '?') {
      return error("nothing to repeat");
    }
    if (c == '\\') {
      ASSIGN_OR_RETURN(CodeSet set, parse_escape(/*in_class=*/false));
      return set_of(std::move(set));
    }
    ++pos_;
    return set_of({{c, c}});
  }

  Result<Ast> parse_group(int depth) {
    const size_t open = pos_;
    ++pos_;  // '('
    if (peek() == '?') {
      if (peek(1) == ':') {
        pos_ += 2;
      } else if (peek(1) == 'P' && peek(2) == '<') {
        pos_ += 3;
        while (!at_end() && peek() != '>') {
          ++pos_;
        }
        if (at_end()) {
          return error("unterminated group name");
        }
        ++pos_;
      } else {
        const uint32_t k = peek(1);
        const std::string meaning = k == '=' || k == '!' ? "lookahead"
                                    : k == '<'           ? "lookbehind"
                                    : k == 'P'           ? "named backreference"
                                    : k == '#'           ? "comment group"
                                    : k == '>'           ? "atomic group"
                                                         : "inline flags";
        pos_ = open;
        return unsupported(k == 0xFFFFFFFF ? "(?" : "(?" + std::string(1, static_cast<char>(k)),
                           meaning);
      }
    }
    ASSIGN_OR_RETURN(Ast inner, parse_alt(depth + 1));
    if (peek() != ')') {
      return error("missing ')'");
    }
    ++pos_;
    return inner;
  }

  // After '['.
  Result<CodeSet> parse_class() {
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodeSet set;
    bool first = true;
    while (true) {
      if (at_end()) {
        return error("unterminated character set");
      }
      if (peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      ASSIGN_OR_RETURN(CodeSet item, parse_class_item());
      if (peek() == '-' && peek(1) != ']' && peek(1) != 0xFFFFFFFF) {
        if (item.size() != 1 || item[0].lo != item[0].hi) {
          return error("bad character range");
        }
        ++pos_;
        ASSIGN_OR_RETURN(CodeSet end, parse_class_item());
        if (end.size() != 1 || end[0].lo != end[0].hi || end[0].lo < item[0].lo) {
          return error("bad character range");
        }
        set.push_back({item[0].lo, end[0].hi});
      } else {
        set.insert(set.end(), item.begin(), item.end());
      }
    }
    return negate ? complement(set) : normalized(std::move(set));
  }

  Result<CodeSet> parse_class_item() {
    if (peek() == '\\') {
      return parse_escape(/*in_class=*/true);
    }
    const uint32_t c = peek();
    ++pos_;
    return CodeSet{{c, c}};
  }

  Result<uint32_t> hex_digits(int count) {
    uint32_t v = 0;
    for (int i = 0; i < count; ++i) {
      const uint32_t h = peek();
      const int d = h >= '0' && h <= '9'   ? static_cast<int>(h - '0')
                    : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                    : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10)
                                           : -1;
      if (d < 0) {
        return error("incomplete hex escape");
      }
      v = v << 4 | static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= kSurrogateLo && v <= kSurrogateHi)) {
      return error("the escape is not a Unicode scalar value");
    }
    return v;
  }

  // At '\\'.
  Result<CodeSet> parse_escape(bool in_class) {
    ++pos_;
    if (at_end()) {
      return error("bad escape (end of pattern)");
    }
    const uint32_t c = peek();
    ++pos_;
    auto one = [](uint32_t v) { return CodeSet{{v, v}}; };
    switch (c) {
      case 'd':
        return digit_set();
      case 'D':
        return complement(digit_set());
      case 'w':
        return word_set();
      case 'W':
        return complement(word_set());
      case 's':
        return space_set();
      case 'S':
        return complement(space_set());
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'a':
        return one('\a');
      case '0':
        return one(0);
      case 'x': {
        ASSIGN_OR_RETURN(uint32_t v, hex_digits(2));
        return one(v);
      }
      case 'u': {
        ASSIGN_OR_RETURN(uint32_t v, hex_digits(4));
        return one(v);
      }
      case 'U': {
        ASSIGN_OR_RETURN(uint32_t v, hex_digits(8));
        return one(v);
      }
      default:
        break;
    }
    if (c == 'b' && in_class) {
      return one('\b');
    }
    --pos_;
    if (c == 'b' || c == 'B') {
      return unsupported(std::string("\\") + static_cast<char>(c), "word boundary");
    }
    if (c == 'A' || c == 'Z') {
      return unsupported(std::string("\\") + static_cast<char>(c), "anchor");
    }
    if (c >= '1' && c <= '9') {
      return unsupported(std::string("\\") + static_cast<char>(c), "backreference");
    }
    if (c < 0x80 && !std::isalnum(static_cast<int>(c))) {
      ++pos_;
      return one(c);
    }
    return error("bad escape");
  }

  std::vector<CodePoint> text_;
  size_t num_bytes_ = 0;
  size_t pos_ = 0;
};

}  // namespace

Result<Ast> parse_regex(std::string_view pattern) {
  if (pattern.size() > static_cast<size_t>(kMaxRegexBytes)) {
    return invalid_argument("the regex is longer than " + std::to_string(kMaxRegexBytes) +
                            " bytes");
  }
  ASSIGN_OR_RETURN(std::vector<CodePoint> text, decode_utf8(pattern));
  Parser parser(std::move(text), pattern.size());
  return parser.parse();
}

}  // namespace crescent::engine::guided::regex_internal
