#include "core/prometheus.h"

#include <gtest/gtest.h>

namespace crescent::prometheus {
namespace {

TEST(HistogramTest, RendersCumulativeBucketsSumAndCount) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(7);
  std::string out;
  h.render("x_seconds", &out);
  EXPECT_EQ(out,
            "x_seconds_bucket{le=\"0.1\"} 1\n"
            "x_seconds_bucket{le=\"1\"} 3\n"
            "x_seconds_bucket{le=\"+Inf\"} 4\n"
            "x_seconds_sum 8.05\n"
            "x_seconds_count 4\n");
}

TEST(HistogramTest, LabelsGoOnEveryLineBeforeLe) {
  Histogram h({1.0});
  h.observe(2);
  std::string out;
  h.render("x_seconds", "role=\"decode\"", &out);
  EXPECT_EQ(out,
            "x_seconds_bucket{role=\"decode\",le=\"1\"} 0\n"
            "x_seconds_bucket{role=\"decode\",le=\"+Inf\"} 1\n"
            "x_seconds_sum{role=\"decode\"} 2\n"
            "x_seconds_count{role=\"decode\"} 1\n");
}

TEST(HistogramTest, EmptyHistogramRendersZeros) {
  Histogram h(latency_buckets_seconds());
  std::string out;
  h.render("y", &out);
  EXPECT_NE(out.find("y_bucket{le=\"+Inf\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("y_sum 0\ny_count 0\n"), std::string::npos) << out;
}

TEST(PrometheusTest, SampleWriterPrefixesNamesAndLabelsEverySample) {
  std::string out;
  SampleWriter w(&out, "crescent_x_", "{model_name=\"m\"}");
  w.counter("pulls_total", "Pulls.", 3);
  w.gauge("bytes", "Bytes held.", 0.5);
  EXPECT_EQ(out,
            "# HELP crescent_x_pulls_total Pulls.\n# TYPE crescent_x_pulls_total counter\n"
            "crescent_x_pulls_total{model_name=\"m\"} 3\n"
            "# HELP crescent_x_bytes Bytes held.\n# TYPE crescent_x_bytes gauge\n"
            "crescent_x_bytes{model_name=\"m\"} 0.5\n");
}

}  // namespace
}  // namespace crescent::prometheus
