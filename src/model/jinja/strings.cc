#include "model/jinja/strings.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cctype>

namespace crescent::model::jinja {
namespace {

size_t char_length(unsigned char c) {
  if (c < 0x80) {
    return 1;
  }
  if (c >= 0xF0) {
    return 4;
  }
  if (c >= 0xE0) {
    return 3;
  }
  if (c >= 0xC0) {
    return 2;
  }
  return 1;
}

// The length of the Python whitespace character at s[pos], or 0.
size_t space_length(std::string_view s, size_t pos) {
  const auto c = static_cast<unsigned char>(s[pos]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) {
    return 1;
  }
  static constexpr std::string_view kMultiByte[] = {
      "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
      "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86",
      "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8",
      "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (std::string_view m : kMultiByte) {
    if (s.substr(pos, m.size()) == m) {
      return m.size();
    }
  }
  return 0;
}

bool is_strip_char(std::string_view c, const std::optional<std::string>& chars) {
  if (!chars) {
    return space_length(c, 0) == c.size();
  }
  return chars->find(c) != std::string::npos;
}

// Applies `map` to each code point of `s` (a malformed byte passes through unchanged).
template <typename Map>
std::string map_code_points(std::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  int32_t i = 0;
  const auto n = static_cast<int32_t>(s.size());
  while (i < n) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, n, c);
    if (c < 0) {
      out.append(s.substr(static_cast<size_t>(start), static_cast<size_t>(i - start)));
      continue;
    }
    const UChar32 mapped = map(c);
    char buf[U8_MAX_LENGTH];
    int32_t len = 0;
    U8_APPEND_UNSAFE(buf, len, mapped);
    out.append(buf, static_cast<size_t>(len));
  }
  return out;
}

bool is_cased(UChar32 c) {
  const int8_t type = u_charType(c);
  return type == U_UPPERCASE_LETTER || type == U_LOWERCASE_LETTER || type == U_TITLECASE_LETTER;
}

}  // namespace

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(char_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) {
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  }
  return n;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  std::vector<std::string> cs = utf8_chars(s);
  size_t b = 0;
  size_t e = cs.size();
  while (left && b < e && is_strip_char(cs[b], chars)) {
    ++b;
  }
  while (right && e > b && is_strip_char(cs[e - 1], chars)) {
    --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) {
    out += cs[i];
  }
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t next = sep->empty() ? std::string_view::npos : s.find(*sep, pos);
      if (next == std::string_view::npos) {
        break;
      }
      out.emplace_back(s.substr(pos, next - pos));
      pos = next + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0;
  while (i < s.size()) {
    size_t n;
    while (i < s.size() && (n = space_length(s, i)) > 0) {
      i += n;
    }
    if (i >= s.size()) {
      break;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(py_strip(s.substr(i), std::nullopt, false, true));
      return out;
    }
    const size_t start = i;
    while (i < s.size() && space_length(s, i) == 0) {
      i += char_length(static_cast<unsigned char>(s[i]));
    }
    out.emplace_back(s.substr(start, std::min(i, s.size()) - start));
  }
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between characters and at both ends.
    int64_t done = 0;
    for (const std::string& c : utf8_chars(s)) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) {
      out += to;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t next = s.find(from, pos);
    if (next == std::string_view::npos) {
      break;
    }
    out += s.substr(pos, next - pos);
    out += to;
    pos = next + from.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

std::string py_upper(std::string_view s) {
  return map_code_points(s, [](UChar32 c) { return u_toupper(c); });
}

std::string py_lower(std::string_view s) {
  return map_code_points(s, [](UChar32 c) { return u_tolower(c); });
}

std::string py_title(std::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](UChar32 c) {
    const UChar32 mapped = previous_cased ? u_tolower(c) : u_totitle(c);
    previous_cased = is_cased(c);
    return mapped;
  });
}

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_code_points(s, [&](UChar32 c) {
    const UChar32 mapped = first ? u_totitle(c) : u_tolower(c);
    first = false;
    return mapped;
  });
}

int64_t count_words(std::string_view s) {
  int64_t words = 0;
  bool in_word = false;
  map_code_points(s, [&](UChar32 c) {
    const bool word_char = u_isalnum(c) || c == '_';
    words += word_char && !in_word ? 1 : 0;
    in_word = word_char;
    return c;
  });
  return words;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.emplace_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
        ++i;
      }
      start = i + 1;
    }
  }
  if (start < s.size()) {
    lines.emplace_back(s.substr(start));
  }
  return lines;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace crescent::model::jinja
