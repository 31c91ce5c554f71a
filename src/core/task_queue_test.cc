#include "core/task_queue.h"

#include <gtest/gtest.h>

#include <atomic>

namespace crescent {
namespace {

TEST(TaskQueueTest, RunsEveryTaskBeforeTheDestructorReturns) {
  std::atomic<int> sum{0};
  {
    TaskQueue queue(2);
    for (int i = 1; i <= 100; ++i) {
      queue.post([&sum, i] { sum += i; });
    }
  }
  EXPECT_EQ(sum.load(), 5050);
}

TEST(TaskQueueTest, OneThreadRunsInPostOrder) {
  std::vector<int> order;
  {
    TaskQueue queue(1);
    for (int i = 0; i < 10; ++i) {
      queue.post([&order, i] { order.push_back(i); });
    }
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace crescent
