// The load generator sends at the scheduled times, never has more than max_concurrency in
// flight, and accounts for every request.

#include "bench/load_generator.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>

#include "bench/openai_request.h"

namespace crescent::bench {
namespace {

RequestOutput sleep_for_ms(int ms, bool success = true) {
  RequestOutput o;
  o.start_time_s = steady_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  o.success = success;
  o.latency_s = steady_seconds() - o.start_time_s;
  return o;
}

TEST(LoadGeneratorTest, SendsAtTheScheduledTimes) {
  LoadOptions opt;
  opt.arrival_offsets_s = {0.0, 0.05, 0.15, 0.3};
  LoadResult r = run_load(opt, [](size_t, size_t) { return sleep_for_ms(1); });
  ASSERT_EQ(r.outputs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GE(r.outputs[i].start_time_s, opt.arrival_offsets_s[i] - 1e-3) << i;
    EXPECT_LE(r.outputs[i].start_time_s, opt.arrival_offsets_s[i] + 0.25) << i;
  }
  EXPECT_GE(r.duration_s, 0.3);
}

TEST(LoadGeneratorTest, MaxConcurrencyBoundsRequestsInFlight) {
  LoadOptions opt;
  opt.arrival_offsets_s.assign(12, 0.0);  // all at once
  opt.max_concurrency = 3;
  std::mutex mu;
  int in_flight = 0, peak = 0;
  std::set<size_t> workers;
  LoadProgress progress;
  LoadResult r = run_load(
      opt,
      [&](size_t i, size_t worker) {
        {
          std::lock_guard<std::mutex> lock(mu);
          peak = std::max(peak, ++in_flight);
          workers.insert(worker);
        }
        RequestOutput o = sleep_for_ms(20, /*success=*/i % 4 != 0);
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
        return o;
      },
      &progress);
  EXPECT_EQ(peak, 3);
  EXPECT_EQ(workers, (std::set<size_t>{0, 1, 2}));
  EXPECT_EQ(progress.num_done.load(), 12);
  EXPECT_EQ(progress.num_failed.load(), 3);  // requests 0, 4, 8
  // Four waves of 20 ms; requests of later waves waited for a slot.
  EXPECT_GE(r.duration_s, 0.075);
  double max_queue = 0;
  for (const auto& o : r.outputs) {
    max_queue = std::max(max_queue, o.queue_time_s);
  }
  EXPECT_GE(max_queue, 0.055);
  EXPECT_EQ(num_load_threads(opt), 3u);
}

TEST(LoadGeneratorTest, ThreadCapWithoutMaxConcurrency) {
  LoadOptions opt;
  opt.arrival_offsets_s.assign(10, 0.0);
  opt.thread_cap = 4;
  EXPECT_EQ(num_load_threads(opt), 4u);
  opt.arrival_offsets_s.assign(2, 0.0);
  EXPECT_EQ(num_load_threads(opt), 2u);
  opt.arrival_offsets_s.clear();
  LoadResult r = run_load(opt, [](size_t, size_t) { return RequestOutput{}; });
  EXPECT_TRUE(r.outputs.empty());
}

}  // namespace
}  // namespace crescent::bench
