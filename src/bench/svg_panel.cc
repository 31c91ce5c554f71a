#include "bench/svg_panel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace crescent::bench::svg {

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

std::string tick_label(double v, double step) {
  char text[32];
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step)));
  std::snprintf(text, sizeof(text), "%.*f", std::min(decimals, 6), v);
  return text;
}

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

}  // namespace crescent::bench::svg
