#include "server/tool_parsers/hermes_tool_parser.h"

namespace crescent::server {
namespace {

using tool_parser_internal::call_from_json;
using tool_parser_internal::is_blank;
using tool_parser_internal::partial_marker_suffix;

constexpr std::string_view kStart = HermesToolParser::kCallStart;
constexpr std::string_view kEnd = HermesToolParser::kCallEnd;

std::optional<ToolCall> parse_block(std::string_view body) {
  return call_from_json(body, {"arguments"});
}

// The streaming state machine: content until the first <tool_call>, then blocks, each sent as
// one call when its </tool_call> arrives (or the output ends).
class HermesStreamer : public ToolCallStreamer {
 private:
  enum class State { kContent, kInCall, kBetweenCalls, kPassThrough };

  // Content before the first call: leading whitespace is held back, because extract() makes a
  // blank prefix null.
  void send_content(std::string_view text, ToolStreamDelta* delta) {
    if (!has_sent_text_ && is_blank(text)) {
      held_blank_.append(text);
      return;
    }
    if (!has_sent_text_) {
      delta->content += held_blank_;
      held_blank_.clear();
      has_sent_text_ = true;
    }
    delta->content.append(text);
  }

  // A malformed block: from its start on everything is content; with no call sent yet, so is
  // the blank prefix that was dropped (extract makes the whole text content).
  void give_up(ToolStreamDelta* delta) {
    if (num_calls_ == 0) {
      delta->content += held_blank_;
      held_blank_.clear();
    }
    delta->content += kStart;
    delta->content += text_;
    text_.clear();
    state_ = State::kPassThrough;
  }

  void step(ToolStreamDelta* delta, bool is_end) override {
    while (true) {
      switch (state_) {
        case State::kPassThrough:
          delta->content += text_;
          text_.clear();
          return;
        case State::kContent:
        case State::kBetweenCalls: {
          const size_t start = text_.find(kStart);
          if (start == std::string::npos) {
            const size_t keep = is_end ? 0 : partial_marker_suffix(text_, kStart);
            if (state_ == State::kContent) {
              send_content(std::string_view(text_).substr(0, text_.size() - keep), delta);
              if (is_end) {
                delta->content += held_blank_;  // no call: the whole text is content
                held_blank_.clear();
              }
            }
            text_.erase(0, text_.size() - keep);
            return;
          }
          if (state_ == State::kContent) {
            send_content(std::string_view(text_).substr(0, start), delta);
          }
          text_.erase(0, start + kStart.size());
          state_ = State::kInCall;
          break;
        }
        case State::kInCall: {
          const size_t end = text_.find(kEnd);
          if (end == std::string::npos && !is_end) {
            return;
          }
          const size_t body_size = end == std::string::npos ? text_.size() : end;
          auto call = parse_block(std::string_view(text_).substr(0, body_size));
          if (!call) {
            give_up(delta);
            return;
          }
          delta->calls.push_back(std::move(*call));
          ++num_calls_;
          text_.erase(0, end == std::string::npos ? text_.size() : end + kEnd.size());
          state_ = State::kBetweenCalls;
          break;
        }
      }
    }
  }

  State state_ = State::kContent;
  std::string held_blank_;  // blank content before anything else
  bool has_sent_text_ = false;
  int num_calls_ = 0;
};

}  // namespace

ExtractedToolCalls HermesToolParser::extract(std::string_view output) const {
  ExtractedToolCalls result;
  const size_t first = output.find(kStart);
  if (first == std::string_view::npos) {
    result.content = std::string(output);
    return result;
  }
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t body = pos + kStart.size();
    const size_t end = output.find(kEnd, body);
    const size_t body_size = end == std::string_view::npos ? output.size() - body : end - body;
    auto call = parse_block(output.substr(body, body_size));
    if (!call) {
      return {std::string(output), {}};
    }
    result.calls.push_back(std::move(*call));
    pos = end == std::string_view::npos ? end : output.find(kStart, end + kEnd.size());
  }
  if (!is_blank(output.substr(0, first))) {
    result.content = std::string(output.substr(0, first));
  }
  return result;
}

std::unique_ptr<ToolCallStreamer> HermesToolParser::start_stream() const {
  return std::make_unique<HermesStreamer>();
}

}  // namespace crescent::server
