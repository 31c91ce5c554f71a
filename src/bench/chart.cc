#include "bench/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace crescent::bench {

namespace {

constexpr double kWidth = 1000;
constexpr double kPanelWidth = 500;
constexpr double kPanelHeight = 280;
constexpr double kTop = 50;  // title band
// Inside a panel: room for the title, tick labels and axis names.
constexpr double kLeft = 62, kRight = 18, kPanelTop = 34, kBottom = 44;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", v);
  return text;
}

// A tick label: as few digits as the step needs.
std::string tick_label(double v, double step) {
  char text[32];
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step)));
  std::snprintf(text, sizeof(text), "%.*f", std::min(decimals, 6), v);
  return text;
}

// Ticks at 1, 2 or 5 times a power of ten, covering [lo, hi] with about `count` steps.
std::vector<double> nice_ticks(double lo, double hi, int count, double* step_out) {
  double span = hi - lo;
  double raw = span / count;
  double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) {
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  *step_out = step;
  return ticks;
}

// One panel's plotting area with linear axes over [x_lo, x_hi] x [y_lo, y_hi].
class Panel {
 public:
  Panel(std::string* svg, double x0, double y0, std::string title, std::string x_name,
        std::string y_name, double x_lo, double x_hi, double y_lo, double y_hi)
      : svg_(svg),
        left_(x0 + kLeft),
        top_(y0 + kPanelTop),
        width_(kPanelWidth - kLeft - kRight),
        height_(kPanelHeight - kPanelTop - kBottom) {
    if (!(x_hi > x_lo)) {
      x_lo -= 0.5;
      x_hi += 0.5;
    }
    if (!(y_hi > y_lo)) {
      y_hi = y_lo + 1;
    }
    double x_step = 1, y_step = 1;
    x_ticks_ = nice_ticks(x_lo, x_hi, 6, &x_step);
    y_ticks_ = nice_ticks(y_lo, y_hi, 5, &y_step);
    // Extend the axes to whole ticks.
    x_lo_ = std::min(x_lo, std::floor(x_lo / x_step) * x_step);
    x_hi_ = std::max(x_hi, std::ceil(x_hi / x_step) * x_step);
    y_lo_ = std::min(y_lo, std::floor(y_lo / y_step) * y_step);
    y_hi_ = std::max(y_hi, std::ceil(y_hi / y_step) * y_step);
    x_ticks_ = nice_ticks(x_lo_, x_hi_, 6, &x_step);
    y_ticks_ = nice_ticks(y_lo_, y_hi_, 5, &y_step);

    *svg_ += "<text x=\"" + num(x0 + kPanelWidth / 2) + "\" y=\"" + num(y0 + 20) +
             "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + escape(title) +
             "</text>\n";
    for (double t : y_ticks_) {
      double y = py(t);
      *svg_ += "<line x1=\"" + num(left_) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left_ + width_) +
               "\" y2=\"" + num(y) + "\" stroke=\"#e4e4e4\"/>\n";
      *svg_ += "<text x=\"" + num(left_ - 5) + "\" y=\"" + num(y + 4) +
               "\" text-anchor=\"end\" font-size=\"11\">" + tick_label(t, y_step) + "</text>\n";
    }
    for (double t : x_ticks_) {
      double x = px(t);
      *svg_ += "<line x1=\"" + num(x) + "\" y1=\"" + num(top_ + height_) + "\" x2=\"" + num(x) +
               "\" y2=\"" + num(top_ + height_ + 4) + "\" stroke=\"#333\"/>\n";
      *svg_ += "<text x=\"" + num(x) + "\" y=\"" + num(top_ + height_ + 16) +
               "\" text-anchor=\"middle\" font-size=\"11\">" + tick_label(t, x_step) + "</text>\n";
    }
    *svg_ += "<rect x=\"" + num(left_) + "\" y=\"" + num(top_) + "\" width=\"" + num(width_) +
             "\" height=\"" + num(height_) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    *svg_ += "<text x=\"" + num(left_ + width_ / 2) + "\" y=\"" + num(top_ + height_ + 34) +
             "\" text-anchor=\"middle\" font-size=\"12\">" + escape(x_name) + "</text>\n";
    double yc = top_ + height_ / 2;
    *svg_ += "<text x=\"" + num(x0 + 14) + "\" y=\"" + num(yc) +
             "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 " + num(x0 + 14) +
             " " + num(yc) + ")\">" + escape(y_name) + "</text>\n";
  }

  double px(double x) const { return left_ + (x - x_lo_) / (x_hi_ - x_lo_) * width_; }
  double py(double y) const { return top_ + height_ - (y - y_lo_) / (y_hi_ - y_lo_) * height_; }
  double bottom() const { return top_ + height_; }
  double top() const { return top_; }

  void bar(double x_from, double x_to, double count) {
    *svg_ += "<rect x=\"" + num(px(x_from)) + "\" y=\"" + num(py(count)) + "\" width=\"" +
             num(std::max(0.5, px(x_to) - px(x_from) - 1)) + "\" height=\"" +
             num(bottom() - py(count)) + "\" fill=\"#4e79a7\"/>\n";
  }
  void vertical_marker(double x, const std::string& color) {
    double X = px(x);
    *svg_ += "<line x1=\"" + num(X) + "\" y1=\"" + num(top_) + "\" x2=\"" + num(X) + "\" y2=\"" +
             num(bottom()) + "\" stroke=\"" + color + "\" stroke-width=\"1.5\" " +
             "stroke-dasharray=\"5,3\"/>\n";
  }
  // Drawn after every marker line, with a white halo, so lines never cross the text.
  void marker_label(const std::string& color, const std::string& label, int slot) {
    *svg_ += "<text x=\"" + num(left_ + width_ - 4) + "\" y=\"" + num(top_ + 14 + 14 * slot) +
             "\" text-anchor=\"end\" font-size=\"11\" fill=\"" + color +
             "\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">" + escape(label) +
             "</text>\n";
  }
  void dot(double x, double y) {
    *svg_ += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) +
             "\" r=\"2.5\" fill=\"#4e79a7\" fill-opacity=\"0.7\"/>\n";
  }
  void failure_mark(double x) {
    double X = px(x);
    *svg_ += "<line x1=\"" + num(X) + "\" y1=\"" + num(bottom() - 8) + "\" x2=\"" + num(X) +
             "\" y2=\"" + num(bottom()) + "\" stroke=\"#e15759\" stroke-width=\"2\"/>\n";
  }
  void note(const std::string& text) {
    *svg_ += "<text x=\"" + num(left_ + width_ / 2) + "\" y=\"" + num(top_ + height_ / 2) +
             "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#888\">" + escape(text) +
             "</text>\n";
  }

 private:
  std::string* svg_;
  double left_, top_, width_, height_;
  double x_lo_ = 0, x_hi_ = 1, y_lo_ = 0, y_hi_ = 1;
  std::vector<double> x_ticks_, y_ticks_;
};

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
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + num(kWidth) +
         "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(height) +
         "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(kWidth / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" " +
         "font-weight=\"bold\">" + escape(title) + "</text>\n";

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
