#include "core/json.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace crescent::internal {
namespace {

using Json = nlohmann::json;

// Builds nothing; keeps the error that stopped the parse. Only runs on texts the DOM parser
// already rejected, so valid ones are parsed once.
struct ErrorRecorder final : Json::json_sax_t {
  bool null() override { return true; }
  bool boolean(bool /*value*/) override { return true; }
  bool number_integer(number_integer_t /*value*/) override { return true; }
  bool number_unsigned(number_unsigned_t /*value*/) override { return true; }
  bool number_float(number_float_t /*value*/, const string_t& /*text*/) override { return true; }
  bool string(string_t& /*value*/) override { return true; }
  bool binary(binary_t& /*value*/) override { return true; }
  bool start_object(std::size_t /*size*/) override { return true; }
  bool key(string_t& /*value*/) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t /*size*/) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position_arg, const std::string& last_token_arg,
                   const Json::exception& e) override {
    has_error = true;
    position = position_arg;
    last_token = last_token_arg;
    id = e.id;
    what = e.what();
    return false;
  }

  bool has_error = false;
  std::size_t position = 0;  // bytes read when the error was found
  std::string last_token;
  int id = 0;  // nlohmann's exception id
  std::string what;
};

// A client's text goes back to it in the message: a number of a million digits must not.
std::string clipped(std::string_view s, size_t max_chars) {
  if (s.size() <= max_chars) {
    return std::string(s);
  }
  return std::string(s.substr(0, max_chars)) + "...";
}

// nlohmann's what() starts with "[json.exception.parse_error.101] "; the client needs the rest.
std::string_view without_exception_tag(std::string_view what) {
  if (what.starts_with("[json.exception.")) {
    if (size_t end = what.find("] "); end != std::string_view::npos) {
      what.remove_prefix(end + 2);
    }
  }
  return what;
}

// "at line L, column C" of the byte at `offset` (columns count bytes, as nlohmann's do).
std::string where(std::string_view text, size_t offset) {
  const std::string_view before = text.substr(0, offset);
  const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
  const size_t line_start = before.rfind('\n');
  const size_t column = line_start == std::string_view::npos ? offset + 1 : offset - line_start;
  return "at line " + std::to_string(line) + ", column " + std::to_string(column);
}

// The offset just past the string whose opening quote is at `open`, or npos when it never
// closes (the parser reports that). memchr keeps this fast on long strings (base64 images).
size_t skip_string(std::string_view text, size_t open) {
  size_t from = open + 1;
  while (from < text.size()) {
    const void* found = std::memchr(text.data() + from, '"', text.size() - from);
    if (found == nullptr) {
      return std::string_view::npos;
    }
    const size_t quote = static_cast<const char*>(found) - text.data();
    size_t first_backslash = quote;
    while (first_backslash > from && text[first_backslash - 1] == '\\') {
      --first_backslash;
    }
    if ((quote - first_backslash) % 2 == 0) {
      return quote + 1;  // not escaped
    }
    from = quote + 1;
  }
  return std::string_view::npos;
}

}  // namespace

Status check_json_depth(std::string_view text, std::string_view subject, int max_depth) {
  int depth = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      i = skip_string(text, i);
      if (i == std::string_view::npos) {
        return Status::ok();
      }
      continue;
    }
    if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return invalid_argument(std::string(subject) + " nests arrays and objects more than " +
                                std::to_string(max_depth) + " levels deep (" + where(text, i) +
                                ")");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
    ++i;
  }
  return Status::ok();
}

Status json_parse_error(std::string_view text, std::string_view subject) {
  constexpr size_t kMaxTokenChars = 40;
  constexpr size_t kMaxDetailChars = 300;
  constexpr int kNumberOverflowId = 406;  // nlohmann's out_of_range.406
  ErrorRecorder recorder;
  const bool is_valid = Json::sax_parse(text, &recorder);
  if (is_valid || !recorder.has_error) {
    // The DOM parser and the SAX pass disagree; the text is rejected all the same.
    return invalid_argument(std::string(subject) + " is not valid JSON");
  }
  if (recorder.id == kNumberOverflowId) {
    // The position is just past the number, or one byte further (the lookahead).
    const std::string& token = recorder.last_token;
    size_t start = text.rfind(token, recorder.position);
    if (start == std::string_view::npos) {
      start = recorder.position >= token.size() ? recorder.position - token.size() : 0;
    }
    start = std::min(start, text.size());
    return invalid_argument(std::string(subject) + " has a number out of range " +
                            where(text, start) + ": " + clipped(token, kMaxTokenChars) +
                            " does not fit in a double (largest magnitude about 1.8e308)");
  }
  return invalid_argument(std::string(subject) + " is not valid JSON: " +
                          clipped(without_exception_tag(recorder.what), kMaxDetailChars));
}

}  // namespace crescent::internal

namespace crescent {
namespace {

// "segment descriptor: " + what, or what alone.
Status field_error(std::string_view context, std::string what) {
  if (context.empty()) {
    return invalid_argument(std::move(what));
  }
  return invalid_argument(std::string(context) + ": " + what);
}

// A wrong value as the message shows it: its JSON text, clipped (it may be a large object).
std::string shown(const nlohmann::json& value) {
  constexpr size_t kMaxValueChars = 40;
  return internal::clipped(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                           kMaxValueChars);
}

}  // namespace

Result<std::string> json_string_field(const nlohmann::json& object, std::string_view key,
                                      std::string_view context) {
  auto it = object.find(key);
  if (it == object.end()) {
    return field_error(context, "missing field '" + std::string(key) + "'");
  }
  if (!it->is_string()) {
    return field_error(context,
                       "field '" + std::string(key) + "' must be a string, got " + shown(*it));
  }
  return it->get<std::string>();
}

Result<uint64_t> json_unsigned_field(const nlohmann::json& object, std::string_view key,
                                     std::string_view context, uint64_t max_value) {
  auto it = object.find(key);
  if (it == object.end()) {
    return field_error(context, "missing field '" + std::string(key) + "'");
  }
  if (!it->is_number_integer()) {
    return field_error(context,
                       "field '" + std::string(key) + "' must be an integer, got " + shown(*it));
  }
  const bool is_negative = !it->is_number_unsigned() && it->get<int64_t>() < 0;
  if (!is_negative && it->get<uint64_t>() <= max_value) {
    return it->get<uint64_t>();
  }
  const std::string range = max_value == UINT64_MAX ? std::string("a non-negative integer")
                                                    : "in 0.." + std::to_string(max_value);
  return field_error(context,
                     "field '" + std::string(key) + "' must be " + range + ", got " + shown(*it));
}

}  // namespace crescent
