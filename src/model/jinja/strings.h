#pragma once
// Python str methods over UTF-8 text, as the chat templates call them (strip, split, title...).
// Case mapping is ICU's per-code-point mapping (Python's, except the rare one-to-many cases
// such as 'ß'.upper()); whitespace is Python's Unicode whitespace.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crescent::model::jinja {

// The UTF-8 characters of `s` (a broken byte is its own character).
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

// str.strip/lstrip/rstrip: Unicode whitespace when `chars` is unset, else those characters.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit): on runs of whitespace when `sep` is unset.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
// str.splitlines() for \n, \r\n and \r.
std::vector<std::string> py_splitlines(std::string_view s);
// str.replace(old, new, count) with count < 0 meaning all.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.title() and str.capitalize().
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
// jinja2's wordcount: the number of runs of word characters (\w).
int64_t count_words(std::string_view s);
// markupsafe.escape.
std::string html_escape(std::string_view s);

}  // namespace crescent::model::jinja
