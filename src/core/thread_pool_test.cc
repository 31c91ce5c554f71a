#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace crescent {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  ThreadPool pool(3);
  for (int round = 0; round < 2000; ++round) {
    int n = 1 + round % 37;
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](int i) { hits[i].fetch_add(1); });
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(hits[i].load(), 1) << "round " << round << " task " << i;
    }
  }
}

TEST(ThreadPoolTest, ParallelRangeCoversWholeRange) {
  ThreadPool pool(2);
  std::vector<int> v(1001, 0);
  pool.parallel_range(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      v[i] += 1;
    }
  });
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 1001);
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
  ThreadPool pool(1);
  int sum = 0;
  pool.parallel_for(10, [&](int i) { sum += i; });
  EXPECT_EQ(sum, 45);
}

TEST(ThreadPoolTest, SurvivesIdleSleepAndWakes) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.parallel_for(4, [&](int) { count++; });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // workers go to sleep
  pool.parallel_for(4, [&](int) { count++; });
  EXPECT_EQ(count.load(), 8);
}

}  // namespace
}  // namespace crescent
