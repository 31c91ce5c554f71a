#pragma once
// Turns the events of one streamed OpenAI response, each with the time it arrived, into a
// RequestOutput: TTFT at the first chunk that carries output, one ITL sample per later output
// chunk (a chunk carrying k tokens is one sample, as vLLM counts it; TPOT divides by the token
// count instead), latency at the last output chunk, token counts from the usage chunk.
//
// An output chunk is any chunk with a non-empty "choices" list, except a chat chunk that only
// announces the assistant role (delta with "role" and no content): it carries no token.
// The request fails on an error event ({"error": ...}), an event that is not JSON, or a stream
// that ends before `data: [DONE]` or without any output chunk. Pure: no clock, no I/O.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/request_output.h"

namespace crescent::bench {

class StreamRecorder {
 public:
  // start_s: when the request was sent (same clock as the event times).
  StreamRecorder(bool is_chat, double start_s);

  // One SSE `data:` payload received at now_s. Events after a failure are ignored.
  void on_event(std::string_view data, double now_s);
  // True once the request has failed (the caller may stop reading).
  bool has_failed() const { return !error_.empty(); }

  // Fills success, error, ttft_s, itl_s, latency_s, output_tokens, generated_text and, when
  // the server reported it, prompt_len.
  void finish(RequestOutput* out) const;

 private:
  void fail(std::string message);

  bool is_chat_;
  double start_s_;
  double last_output_s_;
  bool has_output_ = false;
  bool is_done_ = false;
  std::string error_;
  double ttft_s_ = 0;
  std::vector<double> itl_s_;
  std::string text_;
  int64_t output_tokens_ = -1;
  int64_t prompt_tokens_ = -1;
};

}  // namespace crescent::bench
