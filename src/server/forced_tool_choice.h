#pragma once
// tool_choice "required" and a named function, as vLLM honours them: the output is constrained
// by guided decoding to the arguments of the named function (their JSON Schema), or to a JSON
// array of {"name", "parameters"} calls, and then turned into `tool_calls` without a
// --tool-call-parser (the model writes no markup, only the JSON).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_protocol.h"
#include "server/tool_parsers/tool_parser.h"

namespace crescent::server {

// Sets req->sampling.guided from req->tool_choice (kRequired or kNamed; nothing otherwise) and
// the request's tools (req->chat_render.tools). A 400 naming 'tool_choice' when the request
// also asks for another constraint (response_format, guided_*), when "required" is given more
// than one tool (the grammar cannot tie each name to its own arguments yet), or when a tool's
// parameters use a schema keyword guided decoding does not support. With parallel_tool_calls
// false, "required" allows one call only.
std::optional<ApiError> apply_forced_tool_choice(GenerationRequest* req);

// The calls of a finished output. kNamed: one call of the named function whose arguments are
// the output's text as generated; kRequired: the calls of the output's JSON array. nullopt when the
// output is not what the constraint produces (it was cut by max_tokens or a stop string).
std::optional<std::vector<ToolCall>> forced_tool_calls(const GenerationRequest& req,
                                                       std::string_view output);

}  // namespace crescent::server
