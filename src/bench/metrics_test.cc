// Metric computations against small cases worked out by hand (numpy semantics: linear
// percentiles, population std, 0 for an empty list).

#include "bench/metrics.h"

#include <gtest/gtest.h>

#include "bench/stream_recorder.h"

namespace crescent::bench {
namespace {

RequestOutput ok(double start, double ttft, std::vector<double> itl, int64_t tokens,
                 int64_t prompt_len = 10) {
  RequestOutput o;
  o.success = true;
  o.start_time_s = start;
  o.ttft_s = ttft;
  o.itl_s = std::move(itl);
  o.latency_s = ttft;
  for (double gap : o.itl_s) {
    o.latency_s += gap;
  }
  o.output_tokens = tokens;
  o.prompt_len = prompt_len;
  return o;
}

RequestOutput failed(std::string error) {
  RequestOutput o;
  o.error = std::move(error);
  o.prompt_len = 99;  // not counted: failed requests add no input tokens
  return o;
}

TEST(PercentileTest, MatchesNumpyLinear) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 75), 3.25);  // unsorted input
  // numpy.percentile(range(1, 11), 99) == 9.91
  EXPECT_NEAR(percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 9}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 9}, 100), 9);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({}), 0);
  EXPECT_DOUBLE_EQ(mean({}), 0);
  // Population std of {2, 4, 4, 4, 5, 5, 7, 9} is exactly 2.
  EXPECT_DOUBLE_EQ(population_std({2, 4, 4, 4, 5, 5, 7, 9}), 2);
}

TEST(MetricsTest, TtftStatsInMilliseconds) {
  std::vector<RequestOutput> outs = {ok(0, 0.1, {}, 1), ok(0, 0.3, {}, 1), ok(0, 0.2, {}, 1)};
  MetricsOptions opt;
  opt.duration_s = 1;
  opt.percentiles = {50, 99};
  BenchmarkMetrics m = calculate_metrics(outs, opt);
  const LatencyStats& t = m.latency.at("ttft");
  EXPECT_NEAR(t.mean_ms, 200, 1e-9);
  EXPECT_NEAR(t.median_ms, 200, 1e-9);
  EXPECT_NEAR(t.std_ms, 81.64965809277261, 1e-9);  // sqrt(0.02 / 3) * 1000
  ASSERT_EQ(t.percentiles_ms.size(), 2u);
  EXPECT_EQ(t.percentiles_ms[0].first, 50);
  EXPECT_NEAR(t.percentiles_ms[0].second, 200, 1e-9);
  EXPECT_NEAR(t.percentiles_ms[1].second, 298, 1e-9);  // 0.2 + 0.98 * 0.1
}

TEST(MetricsTest, TpotSkipsOneTokenOutputsButGoodputCountsThemAsZero) {
  // A: one token, TTFT 500 ms. B: five tokens, TTFT 100 ms, last token at 500 ms:
  // TPOT = (0.5 - 0.1) / 4 = 100 ms.
  std::vector<RequestOutput> outs = {ok(0, 0.5, {}, 1), ok(0, 0.1, {0.1, 0.1, 0.1, 0.1}, 5)};
  MetricsOptions opt;
  opt.duration_s = 2;
  opt.goodput = {{"tpot", 50}};
  BenchmarkMetrics m = calculate_metrics(outs, opt);
  EXPECT_EQ(m.tpots_s.size(), 1u);
  EXPECT_NEAR(m.latency.at("tpot").mean_ms, 100, 1e-9);
  EXPECT_NEAR(m.latency.at("tpot").median_ms, 100, 1e-9);
  // A is good (TPOT counts as 0), B is not (100 > 50): 1 good request in 2 s.
  EXPECT_NEAR(m.request_goodput, 0.5, 1e-12);

  opt.goodput = {{"tpot", 100}, {"ttft", 200}};  // B: 100 <= 100 and 100 <= 200; A: TTFT 500
  m = calculate_metrics(outs, opt);
  EXPECT_NEAR(m.request_goodput, 0.5, 1e-12);
  EXPECT_EQ(m.num_good, 1);
  EXPECT_EQ(m.slo_met, (std::map<std::string, int64_t>{{"tpot", 2}, {"ttft", 1}}));
  opt.goodput = {{"e2el", 500}};  // both end at 500 ms
  m = calculate_metrics(outs, opt);
  EXPECT_NEAR(m.request_goodput, 1.0, 1e-12);
  // ITL: a request's longest gap. A has none (good), B's are 100 ms each.
  opt.goodput = {{"itl", 99}};
  EXPECT_NEAR(calculate_metrics(outs, opt).request_goodput, 0.5, 1e-12);
  opt.goodput = {{"itl", 100}};
  EXPECT_NEAR(calculate_metrics(outs, opt).request_goodput, 1.0, 1e-12);
  // One stalled gap is enough to miss it, however short the others.
  opt.goodput = {{"itl", 150}};
  EXPECT_NEAR(calculate_metrics({ok(0, 0.1, {0.01, 0.01, 0.4, 0.01}, 5)}, opt).request_goodput, 0,
              1e-12);

  // Only one-token outputs: no TPOT samples, the stats read 0 as numpy's `or 0` does.
  m = calculate_metrics({ok(0, 0.5, {}, 1)}, opt);
  EXPECT_TRUE(m.tpots_s.empty());
  EXPECT_EQ(m.latency.at("tpot").mean_ms, 0);
  EXPECT_EQ(m.latency.at("tpot").percentiles_ms[0].second, 0);
}

TEST(MetricsTest, ItlIsPerChunkWhenChunksCarrySeveralTokens) {
  // Chunks at 0.1 s (2 tokens), 0.3 s (3 tokens) and 0.35 s (1 token); usage says 6 tokens.
  StreamRecorder rec(/*is_chat=*/false, /*start_s=*/100.0);
  rec.on_event(R"({"choices":[{"index":0,"text":"ab","finish_reason":null}]})", 100.1);
  rec.on_event(R"({"choices":[{"index":0,"text":"cde","finish_reason":null}]})", 100.3);
  rec.on_event(R"({"choices":[{"index":0,"text":"f","finish_reason":"length"}]})", 100.35);
  rec.on_event(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":6}})", 100.36);
  rec.on_event("[DONE]", 100.37);
  RequestOutput out;
  rec.finish(&out);
  ASSERT_TRUE(out.success) << out.error;
  EXPECT_NEAR(out.ttft_s, 0.1, 1e-9);
  ASSERT_EQ(out.itl_s.size(), 2u);  // one gap per later chunk, not per token
  EXPECT_NEAR(out.itl_s[0], 0.2, 1e-9);
  EXPECT_NEAR(out.itl_s[1], 0.05, 1e-9);
  EXPECT_NEAR(out.latency_s, 0.35, 1e-9);  // the last output chunk, not the usage or [DONE]
  EXPECT_EQ(out.output_tokens, 6);
  EXPECT_EQ(out.prompt_len, 7);

  MetricsOptions opt;
  opt.duration_s = 1;
  BenchmarkMetrics m = calculate_metrics({out}, opt);
  EXPECT_NEAR(m.latency.at("itl").mean_ms, 125, 1e-6);  // (200 + 50) / 2
  EXPECT_NEAR(m.latency.at("itl").median_ms, 125, 1e-6);
  EXPECT_NEAR(m.latency.at("tpot").mean_ms, 50, 1e-6);  // (0.35 - 0.1) / (6 - 1)
  EXPECT_NEAR(m.latency.at("e2el").mean_ms, 350, 1e-6);
  EXPECT_EQ(m.total_output, 6);
}

TEST(MetricsTest, CountsThroughputAndFailures) {
  std::vector<RequestOutput> outs = {ok(0, 0.1, {}, 1, 10), failed("HTTP 500: boom"),
                                     ok(0, 0.1, {0.1, 0.1, 0.1, 0.1}, 5, 20)};
  MetricsOptions opt;
  opt.duration_s = 2;
  BenchmarkMetrics m = calculate_metrics(outs, opt);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 6);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{1, 0, 5}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.0);
  EXPECT_DOUBLE_EQ(m.request_goodput, 0);  // no SLOs given
}

TEST(MetricsTest, MissingUsageFallsBackToTheTokenCounter) {
  RequestOutput o = ok(0, 0.1, {0.1}, -1);
  o.generated_text = "one two three";
  MetricsOptions opt;
  opt.duration_s = 1;
  BenchmarkMetrics m = calculate_metrics({o}, opt, [](const std::string& text) -> int64_t {
    return static_cast<int64_t>(std::count(text.begin(), text.end(), ' ')) + 1;
  });
  EXPECT_EQ(m.total_output, 3);
  EXPECT_NEAR(m.latency.at("tpot").mean_ms, 50, 1e-9);  // 0.1 s over 2 tokens
  m = calculate_metrics({o}, opt);  // no counter: 1 token, as vLLM without a tokenizer
  EXPECT_EQ(m.total_output, 1);
}

TEST(MetricsTest, PeakConcurrencyAndTokensPerSecond) {
  // [0, 1), [0.5, 1.5), [1, 2): the third starts as the first ends (half-open): peak 2.
  std::vector<RequestOutput> outs = {ok(0, 0.2, {0.3, 0.5}, 3), ok(0.5, 0.1, {0.9}, 2),
                                     ok(1.0, 0.5, {0.5}, 2)};
  // Token times: 0.2, 0.5, 1.0 | 0.6, 1.5 | 1.5, 2.0 -> buckets [0,1): 3, [1,2): 3, [2,3): 1.
  MetricsOptions opt;
  opt.duration_s = 2;
  BenchmarkMetrics m = calculate_metrics(outs, opt);
  EXPECT_EQ(m.max_concurrent_requests, 2);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 3);

  outs.push_back(ok(0.7, 0.1, {0.1}, 2));  // [0.7, 0.9) overlaps the first two: 3
  m = calculate_metrics(outs, opt);
  EXPECT_EQ(m.max_concurrent_requests, 3);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 5);  // its tokens at 0.8 and 0.9 land in [0, 1)
}

TEST(MetricsTest, AllFailedReadsZero) {
  MetricsOptions opt;
  opt.duration_s = 1;
  BenchmarkMetrics m = calculate_metrics({failed("a"), failed("b")}, opt);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.latency.at("ttft").mean_ms, 0);
  EXPECT_EQ(m.max_concurrent_requests, 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0);
}

}  // namespace
}  // namespace crescent::bench
