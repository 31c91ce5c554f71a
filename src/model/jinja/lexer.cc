#include "model/jinja/lexer.h"

#include <cctype>
#include <utility>

#include "model/jinja/value.h"

namespace crescent::model::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_all(std::string_view s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) {
    --e;
  }
  return std::string(s.substr(0, e));
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      std::string text(src_.substr(pos_, start - pos_));
      const int text_line = line_;
      if (start == std::string_view::npos) {
        emit_text(text, text_line);
        advance_to(src_.size());
        break;
      }
      const char type = src_[start + 1];
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        text = rstrip_all(text);
      } else if (sign != '+' && type != '{') {
        // lstrip_blocks: spaces between the line start and a block or comment tag go.
        const size_t line_start = text.rfind('\n') + 1;
        const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
        if (line_start > 0 || line_starting) {
          bool blank = true;
          for (size_t i = line_start; i < text.size(); ++i) {
            blank = blank && is_space(text[i]);
          }
          if (blank) {
            text.resize(line_start);
          }
        }
      }
      emit_text(text, text_line);
      advance_to(start + 2 + (sign == '-' || sign == '+' ? 1 : 0));
      if (type == '#') {
        comment();
      } else if (type == '%' && raw_block()) {
        continue;
      } else {
        tag(type == '{');
      }
    }
    tokens_.push_back({TokenKind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string_view::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string_view::npos;
  }

  void advance_to(size_t pos) {
    for (; pos_ < pos && pos_ < src_.size(); ++pos_) {
      line_ += src_[pos_] == '\n' ? 1 : 0;
    }
  }

  void emit_text(const std::string& text, int line) {
    if (!text.empty()) {
      tokens_.push_back({TokenKind::kText, text, line});
    }
  }

  // After a tag's closing marker: `-` strips all whitespace, trim_blocks one newline.
  void after_tag_end(char sign, bool trim_newline) {
    if (sign == '-') {
      size_t p = pos_;
      while (p < src_.size() && is_space(src_[p])) {
        ++p;
      }
      advance_to(p);
    } else if (trim_newline && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
  }

  void comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) {
      throw Error("unterminated comment", line_);
    }
    const char sign = end > pos_ && src_[end - 1] == '-' ? '-' : '\0';
    advance_to(end + 2);
    after_tag_end(sign, true);
  }

  // The end of `{% NAME %}` (or with `-`/`+` markers) starting at `from` just after `{%`,
  // and the sign before its `%}`; npos when the tag is something else.
  std::pair<size_t, char> simple_tag_end(size_t from, std::string_view name) const {
    size_t p = from;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
      ++p;
    }
    while (p < src_.size() && is_space(src_[p])) {
      ++p;
    }
    if (src_.substr(p, name.size()) != name) {
      return {std::string_view::npos, '\0'};
    }
    p += name.size();
    while (p < src_.size() && is_space(src_[p])) {
      ++p;
    }
    char sign = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
      sign = src_[p++];
    }
    if (src_.substr(p, 2) != "%}") {
      return {std::string_view::npos, '\0'};
    }
    return {p + 2, sign};
  }

  // {% raw %}...{% endraw %}: the text between is output as is. Called with pos_ just after
  // `{%` (and its marker); false, consuming nothing, when the tag is not `raw`.
  bool raw_block() {
    const auto [end, sign] = simple_tag_end(pos_, "raw");
    if (end == std::string_view::npos) {
      return false;
    }
    const int begin_line = line_;
    advance_to(end);
    after_tag_end(sign, true);
    for (size_t i = src_.find("{%", pos_); i != std::string_view::npos;
         i = src_.find("{%", i + 2)) {
      const auto [close, close_sign] = simple_tag_end(i + 2, "endraw");
      if (close == std::string_view::npos) {
        continue;
      }
      std::string text(src_.substr(pos_, i - pos_));
      if (src_[i + 2] == '-') {
        text = rstrip_all(text);
      }
      emit_text(text, line_);
      advance_to(close);
      after_tag_end(close_sign, true);
      return true;
    }
    throw Error("unexpected end of template, expected 'endraw'", begin_line);
  }

  void tag(bool variable) {
    const int begin_line = line_;
    tokens_.push_back({variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, "", line_});
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        advance_to(pos_ + 1);
      }
      if (pos_ >= src_.size()) {
        throw Error(
            std::string("unexpected end of template, expected '") + (variable ? "}}" : "%}") + "'",
            begin_line);
      }
      const std::string_view rest = src_.substr(pos_);
      const std::string_view close = variable ? "}}" : "%}";
      if (depth == 0) {
        for (const char sign : {'\0', '-', '+'}) {
          const std::string marker = sign ? std::string(1, sign) + std::string(close) : "";
          const std::string_view m = sign ? std::string_view(marker) : close;
          if (rest.substr(0, m.size()) == m && !(sign == '+' && variable)) {
            tokens_.push_back(
                {variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, "", line_});
            advance_to(pos_ + m.size());
            after_tag_end(sign, !variable);
            return;
          }
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
          ++n;
        }
        push(TokenKind::kName, std::string(rest.substr(0, n)), n);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number(rest);
      } else if (c == '\'' || c == '"') {
        string(rest);
      } else {
        static constexpr std::string_view kOperators[] = {
            "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
            ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", "!"};
        bool matched = false;
        for (std::string_view op : kOperators) {
          if (rest.substr(0, op.size()) == op) {
            depth += (op == "(" || op == "[" || op == "{") ? 1 : 0;
            depth -= (op == ")" || op == "]" || op == "}") ? 1 : 0;
            push(TokenKind::kOperator, std::string(op), op.size());
            matched = true;
            break;
          }
        }
        if (!matched) {
          throw Error(std::string("unexpected char '") + c + "'", line_);
        }
      }
    }
  }

  void push(TokenKind kind, std::string text, size_t consumed) {
    tokens_.push_back({kind, std::move(text), line_});
    advance_to(pos_ + consumed);
  }

  void number(std::string_view rest) {
    size_t n = 0;
    bool is_float = false;
    while (n < rest.size() &&
           (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
      ++n;
    }
    if (n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      ++n;
      while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) {
        ++n;
      }
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) {
        ++m;
      }
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        n = m;
        while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) {
          ++n;
        }
      }
    }
    std::string text;
    for (char c : rest.substr(0, n)) {
      if (c != '_') {
        text += c;
      }
    }
    push(is_float ? TokenKind::kFloat : TokenKind::kInteger, text, n);
  }

  void string(std::string_view rest) {
    const char quote = rest[0];
    std::string value;
    size_t i = 1;
    for (; i < rest.size() && rest[i] != quote; ++i) {
      if (rest[i] != '\\' || i + 1 >= rest.size()) {
        value += rest[i];
        continue;
      }
      const char e = rest[++i];
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '0':
          value += '\0';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          const std::string hex(rest.substr(i + 1, digits));
          append_utf8(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)), value);
          i += digits;
          break;
        }
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case '\n':
          break;
        default:
          value += '\\';
          value += e;
      }
    }
    if (i >= rest.size()) {
      throw Error("unterminated string", line_);
    }
    push(TokenKind::kString, value, i + 1);
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  // jinja2's defaults: every \r\n or \r is a \n, and one trailing newline is dropped
  // (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') {
        ++i;
      }
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') {
    normalized.pop_back();
  }
  return Lexer(normalized).run();
}

}  // namespace crescent::model::jinja
