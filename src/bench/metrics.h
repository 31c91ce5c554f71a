#pragma once
// The figures `vllm bench serve` reports, computed the way it computes them: TTFT, TPOT
// (latency after the first chunk over output tokens - 1, only for outputs of 2+ tokens), ITL
// (one sample per streamed chunk, whatever number of tokens the chunk carries), end-to-end
// latency, throughputs, goodput under SLOs, peak output tokens/s and peak concurrency.
// Statistics follow numpy: population std, linear-interpolated percentiles, and an empty list
// reads as 0. Pure functions; no I/O.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench/request_output.h"

namespace crescent::bench {

// numpy.percentile(values, p) with the default linear method; 0 for an empty list.
double percentile(std::vector<double> values, double p);
double mean(const std::vector<double>& values);
double median(const std::vector<double>& values);
double population_std(const std::vector<double>& values);

// One latency metric in milliseconds.
struct LatencyStats {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value) per requested p
};
LatencyStats latency_stats(const std::vector<double>& values_s,
                           const std::vector<double>& percentiles);

// Metric keys, in report order.
inline constexpr const char* kMetricKeys[] = {"ttft", "tpot", "itl", "e2el"};

struct BenchmarkMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0;
  double request_goodput = 0;
  int64_t num_good = 0;  // successful requests that met every SLO
  // Per SLO key, how many successful requests met that one (whatever the others did).
  std::map<std::string, int64_t> slo_met;
  double output_throughput = 0;
  double total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  // Images (random-mm): in every request sent, in the successful ones, and the latter per
  // second of the run.
  int64_t total_images_sent = 0;
  int64_t total_images_completed = 0;
  double image_throughput = 0;
  std::map<std::string, LatencyStats> latency;  // "ttft", "tpot", "itl", "e2el"
  // Per successful request / chunk, in seconds (for charts).
  std::vector<double> ttfts_s, tpots_s, itls_s, e2els_s;
  // Output tokens per request (0 for failed ones), as vLLM's actual_output_lens.
  std::vector<int64_t> output_lens;
};

// Goodput SLOs in milliseconds: keys "ttft", "tpot", "e2el" (vLLM's), and "itl" (crescent's:
// the request's longest gap between two streamed chunks, where a prefill that stalls the
// running decodes shows first). A request is good when each named metric is <= its SLO (TPOT
// counts as 0 for a one-token output, ITL as 0 for a single chunk).
using GoodputSlos = std::map<std::string, double>;

struct MetricsOptions {
  double duration_s = 0;
  std::vector<double> percentiles = {99};
  GoodputSlos goodput;
};

// When a request has no usage (output_tokens < 0), count_tokens(generated_text) is used, as
// vLLM re-tokenizes the text; without it such a request counts 1 token.
using TokenCounter = std::function<int64_t(const std::string&)>;
BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs,
                                   const MetricsOptions& options,
                                   const TokenCounter& count_tokens = nullptr);

}  // namespace crescent::bench
