#include "bench/sweep_report.h"

#include <gtest/gtest.h>

namespace crescent::bench {
namespace {

using Json = nlohmann::json;

Json run(double rate, double goodput, double p99_tpot = 20) {
  return Json{{"request_rate", rate},
              {"request_goodput", goodput},
              {"good_requests", static_cast<int>(goodput * 10)},
              {"completed", 10},
              {"failed", 0},
              {"p99_tpot_ms", p99_tpot},
              {"p99_itl_ms", 30.0},
              {"median_ttft_ms", 50.0},
              {"goodput_slos_ms", {{"itl", 250.0}, {"ttft", 3000.0}}}};
}

SweepSeries series(const std::string& label, const std::vector<Json>& runs) {
  std::vector<std::string> names;
  for (size_t i = 0; i < runs.size(); ++i) {
    names.push_back(label + std::to_string(i) + ".json");
  }
  auto s = sweep_series(label, runs, names);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : SweepSeries{};
}

TEST(SweepReportTest, NamesTheCrossoverWhereTheGoodputWinnerChanges) {
  // Given out of order: sorted by rate. B wins at 1, a tie at 2, A wins at 3 and 4.
  SweepSeries a = series("1P1D", {run(3, 2.4), run(1, 0.7), run(4, 2.0), run(2, 1.55)});
  SweepSeries b = series("colocated", {run(1, 1.0), run(2, 1.5), run(3, 1.2), run(4, 0.5)});
  ASSERT_TRUE(check_comparable(a, b).is_ok());
  EXPECT_EQ(a.points.front().rate, 1);
  EXPECT_EQ(a.slos, "itl <= 250, ttft <= 3000 ms");
  const std::string s = sweep_sentence(a, b);
  EXPECT_NE(s.find("1 req/s 0.70x (0.70 vs 1.00), 2 req/s 1.03x"), std::string::npos) << s;
  EXPECT_NE(s.find("Crossover between 1 and 3 req/s: colocated has the higher goodput up to 1 "
                   "req/s, 1P1D from 3 req/s on."),
            std::string::npos)
      << s;
  const std::string table = sweep_table(a, b);
  EXPECT_NE(table.find("4.00x"), std::string::npos) << table;
  const std::string chart = render_sweep_svg(a, b, "sweep");
  EXPECT_NE(chart.find("<polyline"), std::string::npos);
  EXPECT_NE(chart.find("crossover"), std::string::npos);
  EXPECT_NE(chart.find("itl &lt;= 250"), std::string::npos);
}

TEST(SweepReportTest, NoCrossoverWhenOneSideWinsOrAllTie) {
  // Tied, then A ahead from 2 on: where it pulls ahead.
  SweepSeries a = series("A", {run(1, 1.0), run(2, 1.9), run(3, 2.5)});
  SweepSeries b = series("B", {run(1, 0.98), run(2, 1.0), run(3, 0.1)});
  std::string s = sweep_sentence(a, b);
  EXPECT_NE(s.find("Within 10% of each other up to 1 req/s; A has the higher goodput from 2 req/s "
                   "on (no rate swept where B is ahead)."),
            std::string::npos)
      << s;
  std::string chart = render_sweep_svg(a, b, "t");
  EXPECT_EQ(chart.find(">crossover<"), std::string::npos);
  EXPECT_NE(chart.find("goodput apart by more than 10%"), std::string::npos);
  // A ahead, a tie, A ahead again: no single point to name.
  SweepSeries d = series("D", {run(1, 2.0), run(2, 1.0), run(3, 2.0)});
  SweepSeries e = series("E", {run(1, 1.0), run(2, 1.0), run(3, 1.0)});
  s = sweep_sentence(d, e);
  EXPECT_NE(s.find("No crossover in 1-3 req/s: D has the higher goodput at 1 and 3 req/s and is "
                   "within 10% elsewhere."),
            std::string::npos)
      << s;
  a = series("A", {run(1, 1.0), run(2, 1.9)});
  b = series("B", {run(1, 0.98), run(2, 1.0)});
  SweepSeries c = series("C", {run(1, 1.0), run(2, 1.95)});
  s = sweep_sentence(a, c);
  EXPECT_NE(s.find("No crossover: within 10% of each other at every rate swept."),
            std::string::npos)
      << s;
}

TEST(SweepReportTest, RefusesWhatCannotBeCompared) {
  Json no_goodput = run(1, 1);
  no_goodput.erase("request_goodput");
  auto r = sweep_series("A", {no_goodput}, {"a.json"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("a.json has no request_goodput"), std::string::npos);
  Json inf_rate = run(1, 1);
  inf_rate["request_rate"] = "inf";
  EXPECT_FALSE(sweep_series("A", {inf_rate}, {"a.json"}).is_ok());
  EXPECT_FALSE(sweep_series("A", {run(1, 1), run(1, 2)}, {"a.json", "b.json"}).is_ok());
  Json other_slo = run(2, 1);
  other_slo["goodput_slos_ms"]["itl"] = 100.0;
  r = sweep_series("A", {run(1, 1), other_slo}, {"a.json", "b.json"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("other SLOs"), std::string::npos);

  SweepSeries a = series("A", {run(1, 1), run(2, 1)});
  SweepSeries b = series("B", {run(1, 1), run(3, 1)});
  Status s = check_comparable(a, b);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("other rates (1 2 vs 1 3 req/s)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace crescent::bench
