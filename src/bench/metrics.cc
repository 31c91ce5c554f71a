#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace crescent::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) {
    return 0;
  }
  std::sort(values.begin(), values.end());
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  auto lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

double mean(const std::vector<double>& values) {
  if (values.empty()) {
    return 0;
  }
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double median(const std::vector<double>& values) {
  return percentile(values, 50);
}

double population_std(const std::vector<double>& values) {
  if (values.empty()) {
    return 0;
  }
  double m = mean(values);
  double sum_sq = 0;
  for (double v : values) {
    sum_sq += (v - m) * (v - m);
  }
  return std::sqrt(sum_sq / static_cast<double>(values.size()));
}

LatencyStats latency_stats(const std::vector<double>& values_s,
                           const std::vector<double>& percentiles) {
  LatencyStats s;
  s.mean_ms = mean(values_s) * 1000;
  s.median_ms = median(values_s) * 1000;
  s.std_ms = population_std(values_s) * 1000;
  for (double p : percentiles) {
    s.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000);
  }
  return s;
}

namespace {

// Output tokens per one-second bucket from the first request's start (a chunk counts as one
// token there, as in vLLM), and the exact peak of overlapping [start, end) intervals.
void peak_figures(const std::vector<const RequestOutput*>& ok, BenchmarkMetrics* m) {
  if (ok.empty()) {
    return;
  }
  double min_start = ok.front()->start_time_s;
  double max_end = ok.front()->start_time_s + ok.front()->latency_s;
  for (const RequestOutput* o : ok) {
    min_start = std::min(min_start, o->start_time_s);
    max_end = std::max(max_end, o->start_time_s + o->latency_s);
  }
  auto num_buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
  std::vector<double> tokens_per_second(num_buckets, 0);
  std::vector<std::pair<double, int>> events;
  for (const RequestOutput* o : ok) {
    double t = o->start_time_s + o->ttft_s;
    auto add = [&](double when) {
      double offset = when - min_start;
      if (offset < 0) {
        return;
      }
      auto bucket = static_cast<size_t>(offset);
      if (bucket < num_buckets) {
        tokens_per_second[bucket] += 1;
      }
    };
    add(t);
    for (double gap : o->itl_s) {
      t += gap;
      add(t);
    }
    events.emplace_back(o->start_time_s, 1);
    events.emplace_back(o->start_time_s + o->latency_s, -1);
  }
  m->max_output_tokens_per_s =
      *std::max_element(tokens_per_second.begin(), tokens_per_second.end());
  // Departures sort before arrivals at the same instant: intervals are half-open.
  std::sort(events.begin(), events.end());
  int64_t current = 0;
  for (const auto& [when, delta] : events) {
    current += delta;
    m->max_concurrent_requests = std::max(m->max_concurrent_requests, current);
  }
}

}  // namespace

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs,
                                   const MetricsOptions& options,
                                   const TokenCounter& count_tokens) {
  BenchmarkMetrics m;
  std::vector<double> all_tpots;  // 0 for one-token outputs, for goodput
  std::vector<double> max_itls;   // each request's longest gap (0 without one), for goodput
  std::vector<const RequestOutput*> ok;
  for (const RequestOutput& o : outputs) {
    m.total_images_sent += o.num_images;
    if (!o.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    ok.push_back(&o);
    int64_t output_len = o.output_tokens;
    if (output_len < 0) {
      output_len = count_tokens ? count_tokens(o.generated_text) : 1;
    }
    m.output_lens.push_back(output_len);
    m.total_input += o.prompt_len;
    m.total_images_completed += o.num_images;
    double tpot = 0;
    if (output_len > 1) {
      tpot = (o.latency_s - o.ttft_s) / static_cast<double>(output_len - 1);
      m.tpots_s.push_back(tpot);
    }
    all_tpots.push_back(tpot);
    max_itls.push_back(o.itl_s.empty() ? 0 : *std::max_element(o.itl_s.begin(), o.itl_s.end()));
    m.itls_s.insert(m.itls_s.end(), o.itl_s.begin(), o.itl_s.end());
    m.ttfts_s.push_back(o.ttft_s);
    m.e2els_s.push_back(o.latency_s);
    ++m.completed;
  }
  m.total_output = std::accumulate(m.output_lens.begin(), m.output_lens.end(), int64_t{0});

  for (const auto& [key, slo_ms] : options.goodput) {
    m.slo_met[key] = 0;
  }
  if (!options.goodput.empty()) {
    for (size_t i = 0; i < ok.size(); ++i) {
      bool good = true;
      for (const auto& [key, slo_ms] : options.goodput) {
        double value_s = key == "ttft"   ? m.ttfts_s[i]
                         : key == "tpot" ? all_tpots[i]
                         : key == "e2el" ? m.e2els_s[i]
                         : key == "itl"  ? max_itls[i]
                                         : 0;
        const bool met = value_s <= slo_ms / 1000;
        m.slo_met[key] += met ? 1 : 0;
        good = good && met;
      }
      m.num_good += good ? 1 : 0;
    }
  }

  double dur = options.duration_s > 0 ? options.duration_s : 1e-9;
  m.request_throughput = static_cast<double>(m.completed) / dur;
  m.request_goodput = static_cast<double>(m.num_good) / dur;
  m.output_throughput = static_cast<double>(m.total_output) / dur;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / dur;
  m.image_throughput = static_cast<double>(m.total_images_completed) / dur;
  m.latency["ttft"] = latency_stats(m.ttfts_s, options.percentiles);
  m.latency["tpot"] = latency_stats(m.tpots_s, options.percentiles);
  m.latency["itl"] = latency_stats(m.itls_s, options.percentiles);
  m.latency["e2el"] = latency_stats(m.e2els_s, options.percentiles);
  peak_figures(ok, &m);
  return m;
}

}  // namespace crescent::bench
