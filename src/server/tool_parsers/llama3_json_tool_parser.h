#pragma once
// The llama3_json format (Llama 3.1/3.2 JSON tool calling), as vLLM's `llama3_json` parser
// reads it: an output that starts (after whitespace, optionally after <|python_tag|>) with a
// JSON object {"name": "f", "parameters": {...}} ("arguments" is taken too), possibly several
// separated by ';', is calls and nothing else; any other output is plain content. One object
// that does not parse as a call makes the whole output content. Streamed, a call is sent when
// the ';' after it or the end of the output arrives (words after a call make it content).

#include "server/tool_parsers/tool_parser.h"

namespace crescent::server {

class Llama3JsonToolParser : public ToolParser {
 public:
  // A special token: present only when the request sets skip_special_tokens false.
  static constexpr std::string_view kPythonTag = "<|python_tag|>";

  ExtractedToolCalls extract(std::string_view output) const override;
  std::unique_ptr<ToolCallStreamer> start_stream() const override;
};

}  // namespace crescent::server
