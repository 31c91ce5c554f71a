#include "server/forced_tool_choice.h"

#include <nlohmann/json.hpp>
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
                           "'response_format', 'guided_json' or 'guided_choice'",
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
    if (tools.size() != 1) {
      return bad_request(
          R"('tool_choice' "required" with more than one tool is not supported: the output )"
          "grammar cannot yet tie each function's name to its own arguments. Name one "
          R"(function ({"type": "function", "function": {"name": ...}}) or use "auto")",
          "tool_choice");
    }
    // vLLM's shape: a non-empty array of {"name": ..., "parameters": {...}}.
    ordered_json call = {
        {"type", "object"},
        {"properties",
         {{"name", {{"enum", ordered_json::array({tools[0]["function"]["name"]})}}},
          {"parameters", parameters_of(tools[0])}}},
        {"required", ordered_json::array({"name", "parameters"})}};
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
