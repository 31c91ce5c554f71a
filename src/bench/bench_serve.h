#pragma once
// `crescent bench serve`: the whole run of an online serving benchmark with
// `vllm bench serve`'s flags and meanings. Loads the tokenizer, makes the prompts, asks the
// server for its model name when none is given, sends one test request (a failing test
// request stops the run with its error), then the timed run with a progress bar, and prints
// and saves the report (JSON, and an SVG chart).

#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "core/status.h"

namespace crescent::bench {

struct BenchServeOptions {
  // Where: --base-url, else http://host:port.
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string backend = "openai";  // vllm | openai | openai-chat (chat uses the chat endpoint)
  std::string label;
  // A model directory with tokenizer.json, the file itself or a .gguf; "" -> the server's own,
  // through its /tokenize and /detokenize endpoints.
  std::string tokenizer;
  std::string served_model_name;  // "" -> the first model of GET /v1/models
  // What: the dataset.
  std::string dataset_name = "random";  // random | random-mm | prefix_repetition | sharegpt
  std::string dataset_path;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0;
  int64_t random_prefix_len = 0;
  int64_t random_num_prefixes = 1;  // distinct --random-prefix-len prefixes
  int64_t sharegpt_output_len = -1;
  PrefixRepetitionOptions prefix_repetition;  // --dataset-name prefix_repetition (seed: seed)
  // random-mm (vLLM's flags): the random prompts plus images, chat endpoint only.
  int64_t random_mm_base_items_per_request = 1;
  double random_mm_num_mm_items_range_ratio = 0;
  int64_t random_mm_image_limit = 255;  // --random-mm-limit-mm-per-prompt
  std::vector<ImageBucket> random_mm_buckets = RandomMultiModalOptions{}.buckets;  // normalized
  int64_t num_prompts = 1000;
  // How: traffic shape.
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1;
  int max_concurrency = 0;  // 0: none
  uint64_t seed = 0;
  bool ignore_eos = false;             // forced on for the random dataset, as vLLM does
  std::string extra_body_json = "{}";  // sampling parameters etc., merged into each body
  std::vector<std::pair<std::string, std::string>> headers;
  double request_timeout_s = 3600;
  int num_warmups = 0;
  bool skip_test_request = false;
  // vLLM's --ready-check-timeout-sec: wait up to this long for GET /v1/models to answer 200
  // before anything else (a server still loading its model); 0 asks once.
  double ready_check_timeout_s = 0;
  // Report.
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> metric_percentiles = {99};
  GoodputSlos goodput;
  std::string save_result;  // JSON path ("" -> not saved)
  bool save_detailed = false;
  std::string chart;          // SVG path; "" -> beside save_result with .svg, or none
  bool show_progress = true;  // drawn only when stderr is a terminal
};

// "ttft:100 tpot:50" (spaces or commas between pairs) -> SLOs in ms; keys ttft, tpot, e2el.
Result<GoodputSlos> parse_goodput(std::string_view text);
// "ttft,tpot,itl,e2el"
Result<std::vector<std::string>> parse_percentile_metrics(std::string_view text);
// "50,90,99" -> percentiles in [0, 100]
Result<std::vector<double>> parse_metric_percentiles(std::string_view text);
// "inf" or a number > 0
Result<double> parse_request_rate(std::string_view text);

// Checks the options against each other (dataset path only for sharegpt, the chat endpoint for
// random-mm, ranges, ...).
Status validate(const BenchServeOptions& options);

// Runs the benchmark; progress and notes go to `log` (stderr), the report to `out` (stdout).
// Returns the JSON result (also written to options.save_result). A run where requests fail is
// not an error: the report counts them.
Result<nlohmann::json> run_bench_serve(const BenchServeOptions& options, FILE* out, FILE* log);

}  // namespace crescent::bench
