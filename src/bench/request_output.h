#pragma once
// What one benchmark request measured, in the shape of vLLM's RequestFuncOutput. Times are in
// seconds on the steady clock; the load generator rebases start_time_s to the benchmark start.

#include <cstdint>
#include <string>
#include <vector>

namespace crescent::bench {

struct RequestOutput {
  bool success = false;
  std::string error;  // why it failed ("" on success)
  // Prompt tokens: the dataset's count, replaced by the server's usage.prompt_tokens when sent.
  int64_t prompt_len = 0;
  // usage.completion_tokens from the stream; -1 when the server sent no usage.
  int64_t output_tokens = -1;
  double ttft_s = 0;          // request sent -> first chunk that carries output
  std::vector<double> itl_s;  // gaps between consecutive output chunks (one per chunk)
  double latency_s = 0;       // request sent -> last output chunk
  double start_time_s = 0;    // when the request was sent
  double queue_time_s = 0;    // arrival -> sent (waiting for a --max-concurrency slot)
  int64_t num_images = 0;     // images the request carried (random-mm)
  std::string generated_text;
};

}  // namespace crescent::bench
