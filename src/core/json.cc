#include "core/json.h"

#include <algorithm>
#include <cstddef>
#include <string>

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

}  // namespace

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
    const std::string_view before = text.substr(0, start);
    const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
    const size_t line_start = before.rfind('\n');
    const size_t column = line_start == std::string_view::npos ? start + 1 : start - line_start;
    return invalid_argument(std::string(subject) + " has a number out of range at line " +
                            std::to_string(line) + ", column " + std::to_string(column) + ": " +
                            clipped(token, kMaxTokenChars) +
                            " does not fit in a double (largest magnitude about 1.8e308)");
  }
  return invalid_argument(std::string(subject) + " is not valid JSON: " +
                          clipped(without_exception_tag(recorder.what), kMaxDetailChars));
}

}  // namespace crescent::internal
