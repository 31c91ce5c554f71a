#pragma once
// Parsing JSON that comes from outside the process (request bodies, registrations) with
// nlohmann::json and reading its fields, without letting the library's exceptions out or its
// conversions run on values of the wrong type. Every way a text or a field can fail — bad
// syntax, invalid UTF-8, trailing bytes, a number a double cannot hold (1e400), arrays and
// objects nested deeper than a limit, a missing field, a field of the wrong type — comes back
// as an InvalidArgument Status whose message is a sentence a client can act on.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace crescent {

// How deep arrays and objects may nest in parse_json() by default. nlohmann parses any depth,
// but copying, comparing and dumping a value recurse once per level: a body of a few MB of
// '[' would overflow a thread's stack later, far from the parse.
inline constexpr int kMaxJsonDepth = 512;

namespace internal {
// Why `text`, which nlohmann rejected, is not usable JSON (see parse_json).
Status json_parse_error(std::string_view text, std::string_view subject);
// OK when no array or object in `text` opens deeper than max_depth levels (strings skipped);
// a linear scan, so it runs before the parser. Says nothing about the rest of the syntax.
Status check_json_depth(std::string_view text, std::string_view subject, int max_depth);
}  // namespace internal

// Parses `text` as one JSON value; BasicJson is nlohmann::json or nlohmann::ordered_json.
// A failure's message starts with `subject` (e.g. "the request body"):
//   "the request body is not valid JSON: parse error at line 1, column 5: ..."
//   "the request body has a number out of range at line 1, column 27: 1e400 does not fit in a
//    double (largest magnitude about 1.8e308)"
//   "the request body nests arrays and objects more than 512 levels deep (at line 1, column
//    513)"
template <typename BasicJson = nlohmann::json>
Result<BasicJson> parse_json(std::string_view text, std::string_view subject,
                             int max_depth = kMaxJsonDepth) {
  RETURN_IF_ERROR(internal::check_json_depth(text, subject, max_depth));
  BasicJson j = BasicJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return internal::json_parse_error(text, subject);
  }
  return j;
}

// Typed reads of one field of a parsed object. Each checks the JSON type before it reads:
// nlohmann's get<uint64_t>() of a float such as 1e300 is a float-to-integer conversion out of
// range (undefined behaviour), not an exception. A missing field, a wrong type or a value out
// of range is an InvalidArgument whose message names the field, after `context` (what the
// object is, e.g. "segment descriptor"; empty when the caller adds its own):
//   "segment descriptor: missing field 'address'"
//   "segment descriptor: field 'address' must be a string, got 5"
//   "field 'dp_rank' must be an integer, got 0.5"    (booleans and floats are not integers)
//   "field 'dp_rank' must be in 0..1023, got -1"      (with a max_value)
//   "field 'offset' must be a non-negative integer, got -1"  (without one)
// A wrong value is echoed clipped to a few dozen characters.
Result<std::string> json_string_field(const nlohmann::json& object, std::string_view key,
                                      std::string_view context);
// Any JSON integer in [0, max_value]: one parsed from text is unsigned, one built in code may be
// a signed integer holding a non-negative value.
Result<uint64_t> json_unsigned_field(const nlohmann::json& object, std::string_view key,
                                     std::string_view context, uint64_t max_value = UINT64_MAX);

}  // namespace crescent
