#pragma once
// Tool-call parsers: turn a model's generated text into OpenAI `tool_calls`, after generation
// (extract) or while it streams (ToolCallStreamer), for vLLM's --tool-call-parser formats
// (hermes: Qwen2.5/Qwen3/Hermes `<tool_call>` blocks; llama3_json: Llama 3.1/3.2 JSON objects).
// Pure text processing: no I/O, no engine. A parser is immutable and thread-safe; a streamer
// belongs to one response.

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::server {

struct ToolCall {
  std::string id;  // "chatcmpl-tool-" + 32 hex digits (vLLM's shape)
  std::string name;
  std::string arguments;  // a JSON object's text, keys in the model's order
};

// The whole answer. With at least one call, `content` is the text before the calls (nullopt,
// i.e. null, when that is empty or whitespace); without calls it is the whole text.
struct ExtractedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};

// What one piece of streamed text adds to the answer: content to send now, and calls that are
// complete now (each whole: a call is sent only once its markup has ended).
struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCall> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Streams one response. For well-formed output the content sent and the calls equal
// ToolParser::extract's on the whole text, however the text is split. Markup is never sent as
// content, except when it turns out malformed: then the text from there on is content (as
// extract makes the whole text content), and calls already sent stay sent.
class ToolCallStreamer {
 public:
  virtual ~ToolCallStreamer() = default;
  // With is_end, `text` is the output's last piece: the delta also holds whatever was held
  // back, as push(text) followed by finish() would give.
  ToolStreamDelta push(std::string_view text, bool is_end = false) {
    text_.append(text);
    ToolStreamDelta delta;
    step(&delta, /*is_end=*/false);
    if (is_end) {
      step(&delta, /*is_end=*/true);
    }
    return delta;
  }
  // The end of the output: whatever was held back.
  ToolStreamDelta finish() { return push({}, /*is_end=*/true); }

 protected:
  // Appends to *delta what text_ now decides and drops it from text_ (a format may keep its own
  // cursor instead); at is_end nothing may stay held back.
  virtual void step(ToolStreamDelta* delta, bool is_end) = 0;

  std::string text_;  // received, not yet sent or dropped
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  // Malformed markup (bad JSON, a call without a name) makes the whole text content.
  virtual ExtractedToolCalls extract(std::string_view output) const = 0;
  virtual std::unique_ptr<ToolCallStreamer> start_stream() const = 0;
  // True when the markup may be special tokens in some tokenizers, so that the output must be
  // detokenized with skip_special_tokens false for the parser to see it (vLLM's rule).
  virtual bool needs_special_tokens() const { return false; }
};

// "hermes" or "llama3_json"; InvalidArgument naming the known ones otherwise.
Result<std::unique_ptr<ToolParser>> make_tool_parser(std::string_view name);
// The names make_tool_parser knows, for --help and errors: "hermes, llama3_json".
std::string tool_parser_names();

namespace tool_parser_internal {
// A new call id: "chatcmpl-tool-" + 32 random hex digits.
std::string new_tool_call_id();
// A call from a parsed JSON object {"name": string, <args_key>: object} where args_key is the
// first of `args_keys` present; nullopt when it is not that shape or `text` is not JSON.
std::optional<ToolCall> call_from_json(std::string_view text,
                                       std::initializer_list<std::string_view> args_keys);
// The end (one past the closing brace) of the JSON object that starts at text[pos] == '{',
// tracking strings and escapes; npos when the text ends first.
size_t find_object_end(std::string_view text, size_t pos);
// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker);
bool is_blank(std::string_view text);
}  // namespace tool_parser_internal

}  // namespace crescent::server
