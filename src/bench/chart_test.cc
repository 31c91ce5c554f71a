// The SVG chart is well-formed text with every panel, data marks, and failures shown.

#include "bench/chart.h"

#include <gtest/gtest.h>

namespace crescent::bench {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

std::vector<RequestOutput> run_of(int num_ok, int num_failed) {
  std::vector<RequestOutput> outputs;
  for (int i = 0; i < num_ok + num_failed; ++i) {
    RequestOutput o;
    o.start_time_s = 0.1 * i;
    if (i < num_ok) {
      o.success = true;
      o.output_tokens = 4;
      o.ttft_s = 0.01 * (1 + i % 5);
      o.itl_s = {0.002, 0.003, 0.004};
      o.latency_s = o.ttft_s + 0.009;
    } else {
      o.error = "boom";
    }
    outputs.push_back(o);
  }
  return outputs;
}

TEST(ChartTest, HasEveryPanelAndMarks) {
  auto outputs = run_of(20, 3);
  MetricsOptions opt;
  opt.duration_s = 3;
  BenchmarkMetrics m = calculate_metrics(outputs, opt);
  std::string svg = render_chart_svg(outputs, m, "tiny <random> & co");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_NE(svg.find("tiny &lt;random&gt; &amp; co"), std::string::npos);  // escaped
  for (const char* title :
       {"TTFT (20 samples)", "TPOT (20 samples)", "ITL (60 samples)",
        "End-to-end latency (20 samples)", "TTFT over the run", "TPOT over the run"}) {
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  }
  EXPECT_NE(svg.find("3 failed: red ticks"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 40u);  // 20 TTFT + 20 TPOT points
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_NE(svg.find("p99 "), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(ChartTest, EmptyAndDegenerateRuns) {
  for (auto outputs : {run_of(0, 0), run_of(0, 4), run_of(1, 0)}) {
    MetricsOptions opt;
    opt.duration_s = 1;
    BenchmarkMetrics m = calculate_metrics(outputs, opt);
    std::string svg = render_chart_svg(outputs, m, "t");
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
    EXPECT_EQ(svg.find("nan"), std::string::npos);
    EXPECT_EQ(svg.find("inf"), std::string::npos);
    EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  }
}

}  // namespace
}  // namespace crescent::bench
