#pragma once
// Pieces of the Prometheus text exposition format (version 0.0.4) that every module's
// /metrics uses: a fixed-bucket histogram and the HELP/TYPE header and sample lines.
// Histogram is not thread-safe; guard it with the owner's lock.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crescent::prometheus {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket, _sum and _count lines.
  void render(const std::string& name, std::string* out) const;
  // The same with `labels` (e.g. role="decode", without braces) on every line, before `le`.
  void render(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// "%.9g": what Prometheus parses back to the same double for the values we emit.
std::string format_number(double v);
// Appends "# HELP name help\n# TYPE name type\n".
void append_header(std::string* out, const std::string& name, const char* type, const char* help);
// Appends one "name value\n" sample (name may carry {labels}).
void append_sample(std::string* out, const std::string& name, double value);

// Appends one-sample families that share a name prefix and a label set, each with its HELP and
// TYPE lines: SampleWriter w(&out, "crescent_ec_producer_", "{model_name=\"m\"}");
// w.counter("pulls_total", "...", n) appends crescent_ec_producer_pulls_total{model_name="m"} n.
class SampleWriter {
 public:
  SampleWriter(std::string* out, std::string prefix, std::string labels)
      : out_(out), prefix_(std::move(prefix)), labels_(std::move(labels)) {}
  void counter(const std::string& name, const char* help, double value) {
    append("counter", name, help, value);
  }
  void gauge(const std::string& name, const char* help, double value) {
    append("gauge", name, help, value);
  }

 private:
  void append(const char* type, const std::string& name, const char* help, double value);

  std::string* out_;
  std::string prefix_;
  std::string labels_;
};

// Bucket bounds in seconds for latencies from sub-millisecond to minutes.
std::vector<double> latency_buckets_seconds();

}  // namespace crescent::prometheus
