#include "server/forced_tool_choice.h"

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "engine/guided/grammar.h"

namespace crescent::server {
namespace {

using ordered_json = nlohmann::ordered_json;

// A tool's parameters schema; vLLM's default for a function without one: an empty object.
ordered_json parameters_of(const ordered_json& tool) {
  const ordered_json& function = tool["function"];
  auto p = function.find("parameters");
  if (p == function.end() || p->is_null()) {
    return ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
  }
  return *p;
}

}  // namespace

std::optional<ApiError> apply_forced_tool_choice(GenerationRequest* req) {
  const bool named = req->tool_choice == ToolChoice::kNamed;
  if (!named && req->tool_choice != ToolChoice::kRequired) {
    return std::nullopt;
  }
  const std::string what =
      named ? "'tool_choice' naming a function" : R"('tool_choice' "required")";
  if (req->sampling.guided.is_active()) {
    return bad_request(what +
                           " constrains the output itself and cannot be combined with "
                           "'response_format' or a guided_* field",
                       "tool_choice");
  }
  const ordered_json& tools = req->chat_render.tools;
  std::string schema;
  if (named) {
    for (const ordered_json& tool : tools) {
      if (tool["function"]["name"] == req->tool_choice_name) {
        schema = parameters_of(tool).dump();
      }
    }
  } else {
    // vLLM's shape: a non-empty array of {"name": ..., "parameters": {...}}; with several
    // tools each call is one of them, its name picking its own parameters' schema.
    ordered_json calls = ordered_json::array();
    std::set<std::string> names;
    for (const ordered_json& tool : tools) {
      const std::string& name = tool["function"]["name"].get_ref<const std::string&>();
      if (!names.insert(name).second) {
        return bad_request(
            what + " needs distinct function names: two tools are named '" + name + "'",
            "tool_choice");
      }
      calls.push_back({{"type", "object"},
                       {"properties",
                        {{"name", {{"enum", ordered_json::array({tool["function"]["name"]})}}},
                         {"parameters", parameters_of(tool)}}},
                       {"required", ordered_json::array({"name", "parameters"})}});
    }
    ordered_json call =
        calls.size() == 1 ? std::move(calls[0]) : ordered_json{{"anyOf", std::move(calls)}};
    ordered_json array = {{"type", "array"}, {"minItems", 1}, {"items", std::move(call)}};
    if (!req->parallel_tool_calls) {
      array["maxItems"] = 1;  // OpenAI's parallel_tool_calls: false, at most one call
    }
    schema = array.dump();
  }
  engine::GuidedDecoding guided;
  guided.kind = engine::GuidedDecoding::Kind::kJsonSchema;
  guided.json_schema = std::move(schema);
  auto grammar = engine::guided::compile(guided);
  if (!grammar.is_ok()) {
    return bad_request(what + ": the function's 'parameters': " + grammar.status().message(),
                       "tool_choice");
  }
  req->sampling.guided = std::move(guided);
  return std::nullopt;
}

std::optional<std::vector<ToolCall>> forced_tool_calls(const GenerationRequest& req,
                                                       std::string_view output) {
  const auto j = ordered_json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return std::nullopt;
  }
  auto dump = [](const ordered_json& v) {
    return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  };
  std::vector<ToolCall> calls;
  if (req.tool_choice == ToolChoice::kNamed) {
    if (!j.is_object()) {
      return std::nullopt;
    }
    // The text as generated (vLLM's), so the whole answer equals the streamed pieces joined.
    calls.push_back(
        {tool_parser_internal::new_tool_call_id(), req.tool_choice_name, std::string(output)});
    return calls;
  }
  if (!j.is_array() || j.empty()) {
    return std::nullopt;
  }
  for (const ordered_json& c : j) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        !c.contains("parameters") || !c["parameters"].is_object()) {
      return std::nullopt;
    }
    calls.push_back({tool_parser_internal::new_tool_call_id(), c["name"].get<std::string>(),
                     dump(c["parameters"])});
  }
  return calls;
}

}  // namespace crescent::server
