#pragma once
// The hermes format (Qwen2.5, Qwen3, Hermes 2/3 and QwQ templates), as vLLM's `hermes` parser
// reads it: calls are blocks
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
// possibly several; the text before the first block is the content; text between and after
// blocks is dropped; a last block without its closing tag (the output stopped) still counts.

#include "server/tool_parsers/tool_parser.h"

namespace crescent::server {

class HermesToolParser : public ToolParser {
 public:
  static constexpr std::string_view kCallStart = "<tool_call>";
  static constexpr std::string_view kCallEnd = "</tool_call>";

  ExtractedToolCalls extract(std::string_view output) const override;
  std::unique_ptr<ToolCallStreamer> start_stream() const override;
  // <tool_call> is an ordinary added token in Qwen's tokenizers but special in some others.
  bool needs_special_tokens() const override { return true; }
};

}  // namespace crescent::server
