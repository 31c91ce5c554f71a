#include "bench/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/svg_panel.h"

namespace crescent::bench {

namespace {

using svg::escape;
using svg::kPanelHeight;
using svg::kPanelWidth;
using svg::num;
using svg::Panel;

constexpr double kWidth = 2 * kPanelWidth;
constexpr double kTop = 50;  // title band

void histogram(std::string* svg, double x0, double y0, const std::string& title,
               const std::vector<double>& values_s) {
  std::vector<double> ms;
  for (double v : values_s) {
    ms.push_back(v * 1000);
  }
  if (ms.empty()) {
    Panel panel(svg, x0, y0, title, "ms", "requests", 0, 1, 0, 1);
    panel.note("no samples");
    return;
  }
  auto [lo_it, hi_it] = std::minmax_element(ms.begin(), ms.end());
  double lo = *lo_it, hi = *hi_it;
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  constexpr int kBins = 30;
  std::vector<double> counts(kBins, 0);
  for (double v : ms) {
    auto bin = static_cast<int>((v - lo) / (hi - lo) * kBins);
    counts[static_cast<size_t>(std::clamp(bin, 0, kBins - 1))] += 1;
  }
  double max_count = *std::max_element(counts.begin(), counts.end());
  Panel panel(svg, x0, y0, title + " (" + std::to_string(ms.size()) + " samples)", "ms", "count",
              lo, hi, 0, max_count * 1.15);
  for (int b = 0; b < kBins; ++b) {
    if (counts[static_cast<size_t>(b)] > 0) {
      panel.bar(lo + (hi - lo) * b / kBins, lo + (hi - lo) * (b + 1) / kBins,
                counts[static_cast<size_t>(b)]);
    }
  }
  struct Marker {
    const char* name;
    double value;
    const char* color;
  };
  const Marker markers[] = {{"mean", mean(ms), "#f28e2b"},
                            {"median", median(ms), "#59a14f"},
                            {"p99", percentile(ms, 99), "#e15759"}};
  for (const Marker& m : markers) {
    panel.vertical_marker(m.value, m.color);
  }
  int slot = 0;
  for (const Marker& m : markers) {
    char label[64];
    std::snprintf(label, sizeof(label), "%s %.2f ms", m.name, m.value);
    panel.marker_label(m.color, label, slot++);
  }
}

// Per-request values (ms) against send time; failed requests marked on the time axis.
void over_time(std::string* svg, double x0, double y0, const std::string& title,
               const std::vector<std::pair<double, double>>& points,
               const std::vector<double>& failed_at, double run_s) {
  double y_hi = 0;
  for (const auto& [t, v] : points) {
    y_hi = std::max(y_hi, v);
  }
  Panel panel(svg, x0, y0, title, "request sent at (s)", "ms", 0, std::max(run_s, 1e-3), 0,
              y_hi > 0 ? y_hi * 1.1 : 1);
  for (const auto& [t, v] : points) {
    panel.dot(t, v);
  }
  for (double t : failed_at) {
    panel.failure_mark(t);
  }
  if (points.empty()) {
    panel.note("no successful requests");
  }
}

}  // namespace

std::string render_chart_svg(const std::vector<RequestOutput>& outputs,
                             const BenchmarkMetrics& metrics, const std::string& title) {
  const double height = kTop + 3 * kPanelHeight + 30;
  std::string svg = bench::svg::document_start(kWidth, height, title);

  histogram(&svg, 0, kTop, "TTFT", metrics.ttfts_s);
  histogram(&svg, kPanelWidth, kTop, "TPOT", metrics.tpots_s);
  histogram(&svg, 0, kTop + kPanelHeight, "ITL", metrics.itls_s);
  histogram(&svg, kPanelWidth, kTop + kPanelHeight, "End-to-end latency", metrics.e2els_s);

  std::vector<std::pair<double, double>> ttft_points, tpot_points;
  std::vector<double> failed_at;
  double run_s = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const RequestOutput& o = outputs[i];
    run_s = std::max(run_s, o.start_time_s + o.latency_s);
    if (!o.success) {
      failed_at.push_back(o.start_time_s);
      continue;
    }
    ttft_points.emplace_back(o.start_time_s, o.ttft_s * 1000);
    int64_t num_tokens = i < metrics.output_lens.size() ? metrics.output_lens[i] : 0;
    if (num_tokens > 1) {
      tpot_points.emplace_back(
          o.start_time_s, (o.latency_s - o.ttft_s) / static_cast<double>(num_tokens - 1) * 1000);
    }
  }
  std::string failed_note =
      failed_at.empty() ? "" : " (" + std::to_string(failed_at.size()) + " failed: red ticks)";
  over_time(&svg, 0, kTop + 2 * kPanelHeight, "TTFT over the run" + failed_note, ttft_points,
            failed_at, run_s);
  over_time(&svg, kPanelWidth, kTop + 2 * kPanelHeight, "TPOT over the run" + failed_note,
            tpot_points, failed_at, run_s);
  svg += "</svg>\n";
  return svg;
}

}  // namespace crescent::bench
