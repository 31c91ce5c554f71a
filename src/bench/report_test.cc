// The report reads like `vllm bench serve`'s, line for line, and the JSON has its keys.

#include "bench/report.h"

#include <gtest/gtest.h>

#include <limits>

namespace crescent::bench {
namespace {

BenchmarkMetrics sample_metrics(std::vector<RequestOutput>* outputs) {
  RequestOutput a;
  a.success = true;
  a.prompt_len = 16;
  a.output_tokens = 4;
  a.ttft_s = 0.010;
  a.itl_s = {0.002, 0.002, 0.002};
  a.latency_s = 0.016;
  a.generated_text = "abcd";
  RequestOutput b;
  b.error = "HTTP 500 Internal Server Error: boom";
  *outputs = {a, b};
  MetricsOptions opt;
  opt.duration_s = 0.5;
  opt.percentiles = {99};
  return calculate_metrics(*outputs, opt);
}

TEST(ReportTest, PythonFloat) {
  EXPECT_EQ(python_float(2), "2.0");
  EXPECT_EQ(python_float(0.25), "0.25");
  EXPECT_EQ(python_float(100), "100.0");
  EXPECT_EQ(python_float(99.9), "99.9");
  EXPECT_EQ(python_float(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float(1e20), "1e+20");
}

TEST(ReportTest, ResultBlockMatchesVllmLayout) {
  std::vector<RequestOutput> outputs;
  BenchmarkMetrics m = sample_metrics(&outputs);
  RunInfo info;
  info.request_rate = 2;
  info.max_concurrency = 4;
  info.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::string text = format_report(m, info, 0.5);
  const std::string expected =
      "============ Serving Benchmark Result ============\n"
      "Successful requests:                     1         \n"
      "Failed requests:                         1         \n"
      "Maximum request concurrency:             4         \n"
      "Request rate configured (RPS):           2.00      \n"
      "Benchmark duration (s):                  0.50      \n"
      "Total input tokens:                      16        \n"
      "Total generated tokens:                  4         \n"
      "Request throughput (req/s):              2.00      \n"
      "Output token throughput (tok/s):         8.00      \n"
      "Peak output token throughput (tok/s):    4.00      \n"
      "Peak concurrent requests:                1.00      \n"
      "Total Token throughput (tok/s):          40.00     \n"
      "---------------Time to First Token----------------\n"
      "Mean TTFT (ms):                          10.00     \n"
      "Median TTFT (ms):                        10.00     \n"
      "P99 TTFT (ms):                           10.00     \n"
      "-----Time per Output Token (excl. 1st token)------\n"
      "Mean TPOT (ms):                          2.00      \n"
      "Median TPOT (ms):                        2.00      \n"
      "P99 TPOT (ms):                           2.00      \n"
      "---------------Inter-token Latency----------------\n"
      "Mean ITL (ms):                           2.00      \n"
      "Median ITL (ms):                         2.00      \n"
      "P99 ITL (ms):                            2.00      \n"
      "----------------End-to-end Latency----------------\n"
      "Mean E2EL (ms):                          16.00     \n"
      "Median E2EL (ms):                        16.00     \n"
      "P99 E2EL (ms):                           16.00     \n"
      "==================================================\n";
  EXPECT_EQ(text, expected);

  // An infinite rate hides the configured-rate line, no limit hides the concurrency line,
  // SLOs add goodput, and only the chosen metrics and percentiles are listed.
  info.request_rate = std::numeric_limits<double>::infinity();
  info.max_concurrency = 0;
  info.goodput = {{"ttft", 5}};
  info.percentile_metrics = {"itl"};
  info.percentiles = {50, 99.9};
  MetricsOptions opt;
  opt.duration_s = 0.5;
  opt.percentiles = {50, 99.9};
  opt.goodput = info.goodput;
  m = calculate_metrics(outputs, opt);
  text = format_report(m, info, 0.5);
  EXPECT_EQ(text.find("Request rate configured"), std::string::npos);
  EXPECT_EQ(text.find("Maximum request concurrency"), std::string::npos);
  EXPECT_NE(text.find("Request goodput (req/s):                 0.00"), std::string::npos);
  EXPECT_EQ(text.find("TTFT"), std::string::npos);
  EXPECT_NE(text.find("P50 ITL (ms):"), std::string::npos);
  EXPECT_NE(text.find("P99.9 ITL (ms):"), std::string::npos);
}

TEST(ReportTest, FailuresAreListed) {
  std::vector<RequestOutput> outputs(15);
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].success = i % 2 == 0;
    outputs[i].error = outputs[i].success ? "" : "err " + std::to_string(i);
  }
  std::string text = format_failures(outputs, 3);
  EXPECT_EQ(text,
            "Failed requests during benchmark run detected (capping to 3):\n"
            "Error 0 (request 1): err 1\n"
            "Error 1 (request 3): err 3\n"
            "Error 2 (request 5): err 5\n");
  EXPECT_EQ(format_failures({}), "");
}

TEST(ReportTest, JsonHasVllmKeys) {
  std::vector<RequestOutput> outputs;
  BenchmarkMetrics m = sample_metrics(&outputs);
  RunInfo info;
  info.request_rate = std::numeric_limits<double>::infinity();
  info.model_id = "tiny";
  info.num_prompts = 2;
  auto j = result_json(m, info, 0.5, outputs, /*detailed=*/false);
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_FALSE(j.contains("good_requests"));
  EXPECT_EQ(j["total_input_tokens"], 16);
  EXPECT_EQ(j["total_output_tokens"], 4);
  EXPECT_DOUBLE_EQ(j["duration"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 2);
  for (const char* key :
       {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "output_throughput", "total_token_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 2.0, 1e-9);
  ASSERT_EQ(j["first_errors"].size(), 1u);
  EXPECT_EQ(j["first_errors"][0]["request"], 1);
  EXPECT_FALSE(j.contains("ttfts"));

  j = result_json(m, info, 0.5, outputs, /*detailed=*/true);
  EXPECT_EQ(j["output_lens"], nlohmann::json({4, 0}));
  EXPECT_EQ(j["input_lens"], nlohmann::json({16, 0}));
  EXPECT_EQ(j["errors"][1], "HTTP 500 Internal Server Error: boom");
  EXPECT_EQ(j["itls"][0].size(), 3u);
  EXPECT_EQ(j["generated_texts"][0], "abcd");
}

}  // namespace
}  // namespace crescent::bench
