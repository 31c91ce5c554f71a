#pragma once
// The structured-output fields of a request (response_format json_object / json_schema, and
// vLLM's guided_json / guided_choice / guided_regex) turned into the engine's GuidedDecoding, with
// the schema compiled once here so an unsupported keyword is a 400 naming the field.

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "engine/sampling_params.h"
#include "server/openai_protocol.h"

namespace crescent::server {

// `body` is the parsed request; `body_text` its text, parsed again in order where a schema's
// property order matters (properties are produced in the order the schema lists them).
std::optional<ApiError> parse_guided_decoding(std::string_view body_text,
                                              const nlohmann::json& body,
                                              engine::GuidedDecoding* out);

}  // namespace crescent::server
