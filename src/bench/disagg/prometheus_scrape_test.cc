#include "bench/disagg/prometheus_scrape.h"

#include <gtest/gtest.h>

namespace crescent::bench {
namespace {

constexpr const char* kText =
    "# HELP crescent_kv_transfer_bytes_total KV bytes moved.\n"
    "# TYPE crescent_kv_transfer_bytes_total counter\n"
    "crescent_kv_transfer_bytes_total{role=\"prefill\"} 1024\n"
    "crescent_kv_transfer_bytes_total{role=\"decode\"} 2048\n"
    "crescent_time_to_first_token_seconds_sum 0.25\n"
    "crescent_time_to_first_token_seconds_count 3\n"
    "crescent_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n"
    "no_value_here\n"
    "not_a_number abc\n"
    "\n";

TEST(PrometheusScrapeTest, ReadsSamplesAndSkipsCommentsAndJunk) {
  Scrape s = parse_prometheus_text(kText);
  EXPECT_EQ(s.size(), 5u);
  EXPECT_DOUBLE_EQ(s.at("crescent_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(s.count("not_a_number"), 0u);
}

TEST(PrometheusScrapeTest, PicksTheSeriesByLabel) {
  Scrape s = parse_prometheus_text(kText);
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_kv_transfer_bytes_total", "role=\"decode\""), 2048);
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_kv_transfer_bytes_total", "role=\"prefill\""), 1024);
  // Without a label: the first labelled series (in label order) when none is unlabelled.
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_kv_transfer_bytes_total"), 2048);
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_kv_transfer_bytes_total", "role=\"encode\""), 0);
}

TEST(PrometheusScrapeTest, NamesMatchExactlyNotByPrefix) {
  Scrape s = parse_prometheus_text(kText);
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_time_to_first_token_seconds_sum"), 0.25);
  // "_seconds" is a prefix of "_seconds_sum", not a series of its own.
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_time_to_first_token_seconds"), 0);
  EXPECT_DOUBLE_EQ(scrape_value(s, "crescent_time_to_first_token_seconds_bucket", "le=\"0.1\""), 1);
  EXPECT_DOUBLE_EQ(scrape_value(s, "absent_metric"), 0);
}

}  // namespace
}  // namespace crescent::bench
