#include "server/metrics.h"

#include <gtest/gtest.h>

#include <sstream>

namespace crescent::server {
namespace {

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram h({1.0, 2.0});
  h.observe(0.5);
  h.observe(1.5);
  h.observe(9);
  std::string out;
  h.render("x", &out);
  EXPECT_EQ(out,
            "x_bucket{le=\"1\"} 1\nx_bucket{le=\"2\"} 2\nx_bucket{le=\"+Inf\"} 3\nx_sum 11\n"
            "x_count 3\n");
}

TEST(MetricsTest, RendersEveryFamilyWithHelpAndType) {
  ServerMetrics m;
  m.observe_finished("length", 0.01, 0.1, 10);
  m.observe_http_request(200);
  m.observe_inter_token(0.0025);
  m.observe_inter_token(0.004);
  EngineMetrics e;
  e.num_running = 2;
  e.num_blocks_total = 100;
  e.num_blocks_used = 25;
  std::string text = m.render("tiny", e, 2, /*vllm_names=*/true);
  EXPECT_EQ(m.render("tiny", e, 2).find("vllm:"), std::string::npos) << "vLLM's names only asked";
  for (const char* name :
       {"crescent_num_requests_running", "crescent_num_requests_waiting",
        "crescent_kv_cache_usage_ratio", "crescent_prefix_cache_queries_total",
        "crescent_prefix_cache_hits_total", "crescent_prompt_tokens_total",
        "crescent_generation_tokens_total", "crescent_time_to_first_token_seconds",
        "crescent_time_per_output_token_seconds", "crescent_e2e_request_latency_seconds",
        "crescent_inter_token_latency_seconds"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name), std::string::npos) << name;
  }
  EXPECT_NE(text.find("crescent_kv_cache_usage_ratio{model_name=\"tiny\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(
      text.find(
          "crescent_request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1\n"),
      std::string::npos);
  EXPECT_NE(text.find("crescent_time_per_output_token_seconds_count 1\n"), std::string::npos);
  // Millisecond buckets: a 2.5 ms gap is above 2 ms and within 3 ms.
  EXPECT_NE(text.find("crescent_inter_token_latency_seconds_bucket{le=\"0.002\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("crescent_inter_token_latency_seconds_bucket{le=\"0.003\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("crescent_inter_token_latency_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("crescent_kv_cache_blocks{model_name=\"tiny\"} 100\n"), std::string::npos);
  // The same quantities under vLLM's names and labels.
  const std::string vllm = "{model_name=\"tiny\",engine=\"0\"}";
  for (const std::string& sample :
       {"vllm:num_requests_running" + vllm + " 2\n", "vllm:kv_cache_usage_perc" + vllm + " 0.25\n",
        "vllm:gpu_cache_usage_perc" + vllm + " 0.25\n", "vllm:num_requests_waiting" + vllm + " 0\n",
        "vllm:prefix_cache_hits_total" + vllm + " 0\n",
        std::string("vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_"
                    "reason=\"length\"} 1\n"),
        "vllm:time_per_output_token_seconds_count" + vllm + " 2\n",
        "vllm:request_time_per_output_token_seconds_count" + vllm + " 1\n",
        std::string("vllm:inter_token_latency_seconds_count{model_name=\"tiny\",engine=\"0\"} 2\n"),
        std::string("vllm:time_to_first_token_seconds_count{model_name=\"tiny\",engine=\"0\"} 1\n"),
        std::string(
            "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\",engine=\"0\"} 1\n")}) {
    EXPECT_NE(text.find(sample), std::string::npos) << sample << text;
  }
  // Every sample line is "name{labels} value" or "name value"; as promtool checks, "_total"
  // ends a counter's name and no other's.
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name;
      std::string type;
      words >> name >> type;
      EXPECT_EQ(name.ends_with("_total"), type == "counter") << line;
    }
    if (line.empty() || line[0] == '#') {
      continue;
    }
    auto space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    EXPECT_NO_THROW((void)std::stod(line.substr(space + 1))) << line;
  }
}

}  // namespace
}  // namespace crescent::server
