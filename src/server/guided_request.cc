#include "server/guided_request.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/guided/grammar.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The request's `field` with its keys in the order the client wrote them.
std::optional<ordered_json> ordered_field(std::string_view body_text, const char* field) {
  auto ordered = ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded() || !ordered.is_object() || !ordered.contains(field)) {
    return std::nullopt;
  }
  return std::move(ordered[field]);
}

std::optional<ApiError> parse_response_format(std::string_view body_text, const json& format,
                                              engine::GuidedDecoding* out) {
  const char* kField = "response_format";
  const json type = format.is_object() ? format.value("type", json()) : json();
  if (type == "text") {
    return std::nullopt;
  }
  if (type == "json_object") {
    out->kind = engine::GuidedDecoding::Kind::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema") {
    return bad_request(R"('response_format' must be null or have "type" "text", "json_object" )"
                       R"(or "json_schema")",
                       kField);
  }
  auto spec = format.find("json_schema");
  if (spec == format.end() || !spec->is_object() || !spec->contains("schema") ||
      !(*spec)["schema"].is_object()) {
    return bad_request(R"('response_format' of type "json_schema" needs "json_schema": )"
                       R"({"name": ..., "schema": {...}})",
                       kField);
  }
  std::optional<ordered_json> ordered = ordered_field(body_text, kField);
  if (!ordered.has_value()) {
    return bad_request("the request body does not parse", kField);  // parse_json took it: a bug
  }
  out->kind = engine::GuidedDecoding::Kind::kJsonSchema;
  out->json_schema = (*ordered)["json_schema"]["schema"].dump();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_guided_decoding(std::string_view body_text, const json& body,
                                              engine::GuidedDecoding* out) {
  *out = engine::GuidedDecoding();
  std::vector<const char*> given;
  for (const char* field : {"response_format", "guided_json", "guided_choice", "guided_regex"}) {
    if (auto it = body.find(field); it != body.end() && !it->is_null()) {
      given.push_back(field);
    }
  }
  if (given.size() > 1) {
    return bad_request(std::string("only one of 'response_format', 'guided_json', "
                                   "'guided_choice' and 'guided_regex' may be given, got '") +
                           given[0] + "' and '" + given[1] + "'",
                       given[1]);
  }
  if (given.empty()) {
    return std::nullopt;
  }
  const std::string field = given[0];
  const json& value = body[field];
  if (field == "response_format") {
    if (auto error = parse_response_format(body_text, value, out)) {
      return error;
    }
  } else if (field == "guided_json") {
    out->kind = engine::GuidedDecoding::Kind::kJsonSchema;
    if (value.is_string()) {
      out->json_schema = value.get<std::string>();  // a schema's JSON text, as vLLM takes it
    } else if (value.is_object()) {
      std::optional<ordered_json> ordered = ordered_field(body_text, "guided_json");
      if (!ordered.has_value()) {
        return bad_request("the request body does not parse", field);
      }
      out->json_schema = ordered->dump();
    } else {
      return bad_request("'guided_json' must be a JSON Schema object or its JSON text", field);
    }
  } else if (field == "guided_regex") {
    if (!value.is_string()) {
      return bad_request("'guided_regex' must be a string", field);
    }
    out->kind = engine::GuidedDecoding::Kind::kRegex;
    out->regex = value.get<std::string>();
  } else {
    if (!value.is_array()) {
      return bad_request("'guided_choice' must be a list of strings", field);
    }
    for (const json& c : value) {
      if (!c.is_string()) {
        return bad_request("'guided_choice' must be a list of strings", field);
      }
      out->choices.push_back(c.get<std::string>());
    }
    out->kind = engine::GuidedDecoding::Kind::kChoice;
  }
  if (!out->is_active()) {
    return std::nullopt;
  }
  auto grammar = engine::guided::compile(*out);
  if (!grammar.is_ok()) {
    return bad_request("'" + field + "': " + grammar.status().message(), field);
  }
  return std::nullopt;
}

}  // namespace crescent::server
