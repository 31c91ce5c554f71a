#pragma once
// `crescent bench disagg --encode`: the EC connector's transfer of one image's embeddings
// (EPD, DESIGN.md §2b) against a memcpy of the same bytes timed in the same run. An EcProducer
// and an EcConsumer, each with its own transfer engine, run in this process: every image is
// published into the producer's pool (the "encoder" writes it), then fetched by the consumer
// (HELLO once per connection; ACQUIRE, READ through the transport, RELEASE per image), which
// is what a prefill worker pays per image. See docs/epd_benchmark.md.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::bench {

struct EcBenchOptions {
  std::string ec_transport = "shm";
  std::string tokens = "256,1196";  // Qwen2-VL-2B: a 448x448 image, and a 1000x750-ish one
  int64_t hidden_size = 1536;       // Qwen2-VL-2B's merger output
  int num_images = 50;
  int num_warmup = 2;
  double target_ratio = 2.0;
  std::string json_path;  // "" -> no JSON
};

// Refuses out-of-range options with the flag's name (--tokens, --hidden-size, ...).
Status validate_ec_bench_options(const EcBenchOptions& o);

// "256,1196" -> {256, 1196}; each 1..kMaxEcTokensPerImage.
Result<std::vector<int64_t>> parse_ec_bench_tokens(const std::string& text);

// Runs it with validated options: progress and the report on stdout, the JSON when asked.
// Every fetched float is checked; an error also when a reservation outlives the run by 5 s.
Status run_ec_bench(const EcBenchOptions& o);

}  // namespace crescent::bench
