#pragma once
// The result of a run as `vllm bench serve` prints it (the "Serving Benchmark Result" block,
// same labels and layout) and as it saves it (the same keys in the JSON file, plus the first
// errors, which crescent never leaves out). Pure functions.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/metrics.h"
#include "bench/request_output.h"
#include "core/status.h"

namespace crescent::bench {

// What the run was, for the report and the JSON file.
struct RunInfo {
  std::string date;  // "20250101-120000"
  std::string backend = "openai";
  std::string label;
  std::string model_id;
  std::string tokenizer_id;
  std::string base_url;
  std::string endpoint;
  std::string dataset_name;
  int64_t num_prompts = 0;
  double request_rate = 0;  // +inf: all at once
  double burstiness = 1;
  int max_concurrency = 0;  // 0: none
  uint64_t seed = 0;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> percentiles = {99};
  GoodputSlos goodput;
  bool has_images = false;  // random-mm: the report and the JSON count the images
};

// Python's str(float): "2.0", "0.25", "inf".
std::string python_float(double value);

// "Failed requests during benchmark run detected (capping to N):" and one line per error;
// "" when nothing failed.
std::string format_failures(const std::vector<RequestOutput>& outputs, size_t max_shown = 10);

// The result block, from the "=== Serving Benchmark Result ===" line to the closing "===".
std::string format_report(const BenchmarkMetrics& metrics, const RunInfo& info, double duration_s);

// The JSON result. detailed adds the per-request lists (input_lens, output_lens, ttfts, itls,
// latencies, start_times, queue_times, generated_texts, errors).
nlohmann::json result_json(const BenchmarkMetrics& metrics, const RunInfo& info, double duration_s,
                           const std::vector<RequestOutput>& outputs, bool detailed);

// A --save-result file read back: a JSON object, or an error naming the path.
Result<nlohmann::json> read_result_file(const std::string& path);

// A result's goodput SLOs as "itl <= 250, ttft <= 3000 ms" (keys in order); "" without any.
std::string goodput_slos_text(const nlohmann::json& result);

}  // namespace crescent::bench
