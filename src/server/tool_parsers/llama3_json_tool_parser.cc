#include "server/tool_parsers/llama3_json_tool_parser.h"

namespace crescent::server {
namespace {

using tool_parser_internal::call_from_json;
using tool_parser_internal::find_object_end;

constexpr std::string_view kTag = Llama3JsonToolParser::kPythonTag;
constexpr std::string_view kBlank = " \t\r\n";

size_t skip_blank(std::string_view text, size_t pos) {
  const size_t p = text.find_first_not_of(kBlank, pos);
  return p == std::string_view::npos ? text.size() : p;
}

std::optional<ToolCall> parse_object(std::string_view text) {
  return call_from_json(text, {"arguments", "parameters"});
}

// Where the calls start: after leading blanks and an optional <|python_tag|>; npos when the
// output is not calls.
size_t calls_start(std::string_view text) {
  size_t pos = skip_blank(text, 0);
  if (text.substr(pos).starts_with(kTag)) {
    pos = skip_blank(text, pos + kTag.size());
  }
  return pos < text.size() && text[pos] == '{' ? pos : std::string_view::npos;
}

// One step over calls text from `pos`: the objects "{...}" separated by ';' with blanks.
enum class Scan { kCall, kIncomplete, kEnd, kMalformed };

// From `*pos` (just after the previous object, or at the first '{'): the next call, or where
// the text stops. `is_end`: nothing more will come.
Scan next_call(std::string_view text, bool is_first, bool is_end, size_t* pos, ToolCall* call) {
  size_t p = skip_blank(text, *pos);
  if (!is_first) {
    if (p == text.size()) {
      return is_end ? Scan::kEnd : Scan::kIncomplete;
    }
    if (text[p] != ';') {
      return Scan::kMalformed;
    }
    p = skip_blank(text, p + 1);
    if (p == text.size()) {
      return is_end ? Scan::kEnd : Scan::kIncomplete;  // a trailing ';' ends the calls
    }
  }
  if (text[p] != '{') {
    return Scan::kMalformed;
  }
  const size_t end = find_object_end(text, p);
  if (end == std::string_view::npos) {
    return is_end ? Scan::kMalformed : Scan::kIncomplete;
  }
  auto parsed = parse_object(text.substr(p, end - p));
  if (!parsed) {
    return Scan::kMalformed;
  }
  *call = std::move(*parsed);
  *pos = end;
  return Scan::kCall;
}

class Llama3JsonStreamer : public ToolCallStreamer {
 private:
  enum class State { kUndecided, kCalls, kContent };

  void step(ToolStreamDelta* delta, bool is_end) override {
    if (state_ == State::kUndecided) {
      // Calls or content: decided by the first non-blank text (the tag may arrive in pieces).
      const size_t p = skip_blank(text_, 0);
      std::string_view rest = std::string_view(text_).substr(p);
      const bool may_be_tag = kTag.starts_with(rest.substr(0, kTag.size()));
      if (!is_end &&
          (rest.empty() || (may_be_tag && rest.size() < kTag.size()) ||
           (rest.starts_with(kTag) && skip_blank(text_, p + kTag.size()) == text_.size()))) {
        return;
      }
      if (calls_start(text_) == std::string::npos) {
        state_ = State::kContent;
        sent_ = 0;
      } else {
        state_ = State::kCalls;
        sent_ = calls_start(text_);
      }
    }
    if (state_ == State::kCalls && !step_calls(delta, is_end)) {
      // Content from here; with no call sent, the whole output (as extract does).
      state_ = State::kContent;
      sent_ = num_calls_ == 0 ? 0 : last_call_end_;
    }
    if (state_ == State::kContent) {
      delta->content.append(text_, sent_, std::string::npos);
      sent_ = text_.size();
    }
  }

  // Sends each call once the text after it shows it is one: a ';' (another call follows) or
  // the end. A call followed by words is content, as in extract(). False when malformed.
  bool step_calls(ToolStreamDelta* delta, bool is_end) {
    while (true) {
      size_t p = skip_blank(text_, sent_);
      if (held_call_) {
        if (p == text_.size()) {
          if (is_end) {
            send_held(delta);
          }
          return true;
        }
        if (text_[p] != ';') {
          return false;
        }
        send_held(delta);
        p = skip_blank(text_, p + 1);
        sent_ = p;
      }
      if (p == text_.size()) {
        // The end after a ';' ends the calls; the end before any call is not calls.
        return !is_end || num_calls_ > 0;
      }
      if (text_[p] != '{') {
        return false;
      }
      const size_t end = find_object_end(text_, p);
      if (end == std::string::npos) {
        return !is_end;
      }
      held_call_ = parse_object(std::string_view(text_).substr(p, end - p));
      if (!held_call_) {
        return false;
      }
      sent_ = end;
      held_call_end_ = end;
    }
  }

  void send_held(ToolStreamDelta* delta) {
    delta->calls.push_back(std::move(*held_call_));
    held_call_.reset();
    ++num_calls_;
    last_call_end_ = held_call_end_;
  }

  State state_ = State::kUndecided;
  // kCalls: where the scan goes on; kContent: the end of what was sent.
  size_t sent_ = 0;
  std::optional<ToolCall> held_call_;  // parsed, waiting for what follows it
  size_t held_call_end_ = 0;
  size_t last_call_end_ = 0;  // of the last call sent
  int num_calls_ = 0;
};

}  // namespace

ExtractedToolCalls Llama3JsonToolParser::extract(std::string_view output) const {
  ExtractedToolCalls result;
  size_t pos = calls_start(output);
  if (pos == std::string_view::npos) {
    result.content = std::string(output);
    return result;
  }
  while (true) {
    ToolCall call;
    switch (next_call(output, result.calls.empty(), /*is_end=*/true, &pos, &call)) {
      case Scan::kCall:
        result.calls.push_back(std::move(call));
        continue;
      case Scan::kEnd:
        return result;         // content null: the output is calls only
      case Scan::kIncomplete:  // not with is_end
      case Scan::kMalformed:
        return {std::string(output), {}};
    }
  }
}

std::unique_ptr<ToolCallStreamer> Llama3JsonToolParser::start_stream() const {
  return std::make_unique<Llama3JsonStreamer>();
}

}  // namespace crescent::server
