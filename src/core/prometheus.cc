#include "core/prometheus.h"

#include <cstdio>

namespace crescent::prometheus {

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void append_header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void append_sample(std::string* out, const std::string& name, double value) {
  *out += name + " " + format_number(value) + "\n";
}

std::vector<double> latency_buckets_seconds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
          0.5,    1.0,   2.5,    5.0,   10.0, 30.0,  60.0, 120.0};
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < upper_bounds_.size() && value > upper_bounds_[i]) {
    ++i;
  }
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  render(name, "", out);
}

void Histogram::render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string bucket = name + "_bucket{" + (labels.empty() ? "" : labels + ",") + "le=\"";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += bucket + format_number(upper_bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  *out += bucket + "+Inf\"} " + std::to_string(cumulative) + "\n";
  *out += name + "_sum" + plain + " " + format_number(sum_) + "\n";
  *out += name + "_count" + plain + " " + std::to_string(count_) + "\n";
}

void SampleWriter::append(const char* type, const std::string& name, const char* help,
                          double value) {
  const std::string full = prefix_ + name;
  append_header(out_, full, type, help);
  append_sample(out_, full + labels_, value);
}

}  // namespace crescent::prometheus
