#include "server/tool_parsers/tool_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/ids.h"
#include "server/tool_parsers/hermes_tool_parser.h"
#include "server/tool_parsers/llama3_json_tool_parser.h"

namespace crescent::server {

Result<std::unique_ptr<ToolParser>> make_tool_parser(std::string_view name) {
  if (name == "hermes") {
    return std::unique_ptr<ToolParser>(std::make_unique<HermesToolParser>());
  }
  if (name == "llama3_json") {
    return std::unique_ptr<ToolParser>(std::make_unique<Llama3JsonToolParser>());
  }
  return invalid_argument("unknown tool call parser '" + std::string(name) +
                          "' (known: " + tool_parser_names() + ")");
}

std::string tool_parser_names() {
  return "hermes, llama3_json";
}

namespace tool_parser_internal {

std::string new_tool_call_id() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = random_u64();
    for (int i = 0; i < 16; ++i) {
      id.push_back(kHex[bits & 0xf]);
      bits >>= 4;
    }
  }
  return id;
}

std::optional<ToolCall> call_from_json(std::string_view text,
                                       std::initializer_list<std::string_view> args_keys) {
  // Ordered: the arguments keep the model's key order when re-serialized.
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return std::nullopt;
  }
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  for (std::string_view key : args_keys) {
    auto args = j.find(std::string(key));
    if (args == j.end()) {
      continue;
    }
    if (!args->is_object()) {
      return std::nullopt;
    }
    ToolCall call;
    call.id = new_tool_call_id();
    call.name = name->get<std::string>();
    // The parser accepted only valid UTF-8, so nothing is replaced here.
    call.arguments = args->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return call;
  }
  return std::nullopt;
}

size_t find_object_end(std::string_view text, size_t pos) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) {
        return i + 1;
      }
    }
  }
  return std::string_view::npos;
}

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) {
      return n;
    }
  }
  return 0;
}

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace tool_parser_internal
}  // namespace crescent::server
