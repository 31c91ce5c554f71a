#include "proxy/upstream_health.h"

#include <gtest/gtest.h>

namespace crescent::proxy {
namespace {

UpstreamHealth three(UpstreamHealthOptions o = {.base_backoff_ms = 100, .max_backoff_ms = 1000}) {
  return UpstreamHealth({"http://d0", "http://d1", "http://d2"}, o);
}

TEST(UpstreamHealthTest, RoundRobinSkipsEjectedServers) {
  UpstreamHealth h = three();
  EXPECT_EQ(h.num_up(), 3);
  h.report_unreachable(1, 0, "refused");
  EXPECT_FALSE(h.is_up(1));
  EXPECT_EQ(h.num_up(), 2);
  for (int i = 0; i < 6; ++i) {
    auto pick = h.next_up();
    ASSERT_TRUE(pick.has_value());
    EXPECT_NE(*pick, 1u);
  }
  EXPECT_EQ(h.describe_down(), "http://d1 (refused)");
}

TEST(UpstreamHealthTest, NoneUpGivesNothing) {
  UpstreamHealth h = three();
  for (size_t i = 0; i < 3; ++i) {
    h.report_unreachable(i, 0, "refused");
  }
  EXPECT_EQ(h.num_up(), 0);
  EXPECT_FALSE(h.next_up().has_value());
}

TEST(UpstreamHealthTest, ProbesBackOffExponentiallyUpToTheMaximum) {
  UpstreamHealth h = three();
  h.report_unreachable(0, 1000, "refused");
  EXPECT_TRUE(h.take_due_probes(1099).empty());
  std::vector<size_t> due = h.take_due_probes(1100);
  ASSERT_EQ(due, std::vector<size_t>{0});
  EXPECT_TRUE(h.take_due_probes(5000).empty()) << "a probe in progress is not handed out twice";
  // Failed probes: 200, 400, 800, then 1000 ms (the maximum) apart.
  int64_t now = 1100;
  for (int64_t wait : {200, 400, 800, 1000, 1000}) {
    h.probe_failed(0, now, "still refused");
    EXPECT_TRUE(h.take_due_probes(now + wait - 1).empty()) << "after " << wait - 1 << " ms";
    now += wait;
    ASSERT_EQ(h.take_due_probes(now), std::vector<size_t>{0}) << "after " << wait << " ms";
  }
  EXPECT_EQ(h.describe_down(), "http://d0 (still refused)");
}

TEST(UpstreamHealthTest, ASucceedingProbeRestoresAndResetsTheBackoff) {
  UpstreamHealth h = three();
  h.report_unreachable(2, 0, "refused");
  ASSERT_EQ(h.take_due_probes(100).size(), 1u);
  h.probe_failed(2, 100, "refused");
  ASSERT_EQ(h.take_due_probes(300).size(), 1u);
  h.probe_succeeded(2);
  EXPECT_TRUE(h.is_up(2));
  EXPECT_EQ(h.num_up(), 3);
  EXPECT_EQ(h.describe_down(), "");
  // Ejected again: the first probe is base_backoff_ms away again, not 400 ms.
  h.report_unreachable(2, 1000, "reset");
  EXPECT_EQ(h.take_due_probes(1100).size(), 1u);
  auto states = h.states();
  ASSERT_EQ(states.size(), 3u);
  EXPECT_EQ(states[2].num_ejections, 2u);
  EXPECT_EQ(states[0].num_ejections, 0u);
  EXPECT_EQ(states[2].why_down, "reset");
}

TEST(UpstreamHealthTest, FailuresOfADownServerDoNotCountOrReschedule) {
  UpstreamHealth h = three();
  h.report_unreachable(0, 0, "refused");
  h.report_unreachable(0, 90, "refused again");  // calls that raced the ejection
  EXPECT_EQ(h.states()[0].num_ejections, 1u);
  EXPECT_EQ(h.take_due_probes(100).size(), 1u) << "the schedule of the first ejection holds";
  // A probe result for a server that another probe already restored changes nothing.
  h.probe_succeeded(0);
  h.probe_failed(0, 200, "late failure");
  EXPECT_TRUE(h.is_up(0));
}

}  // namespace
}  // namespace crescent::proxy
