#include "engine/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace crescent::engine {
namespace {

TEST(KvEventLogTest, FirstReadIsASnapshotThenIncrementalEvents) {
  KvEventLog log("e1", 4, 8);
  log.record_stored({1, 2, 3});
  KvEventsPage first = log.read_since("", 0);
  EXPECT_TRUE(first.reset);
  EXPECT_EQ(first.engine_id, "e1");
  EXPECT_EQ(first.block_size, 4);
  EXPECT_EQ(first.seq, 1);
  ASSERT_EQ(first.events.size(), 1u);
  std::vector<uint64_t> held = first.events[0].hashes;
  std::ranges::sort(held);
  EXPECT_EQ(held, (std::vector<uint64_t>{1, 2, 3}));

  log.record_removed(2);
  log.record_stored({4});
  KvEventsPage next = log.read_since("e1", first.seq);
  EXPECT_FALSE(next.reset);
  EXPECT_EQ(next.seq, 3);
  ASSERT_EQ(next.events.size(), 2u);
  EXPECT_EQ(next.events[0].type, KvEventType::kRemoved);
  EXPECT_EQ(next.events[0].hashes, (std::vector<uint64_t>{2}));
  EXPECT_EQ(next.events[1].type, KvEventType::kStored);
  EXPECT_EQ(next.events[1].seq, 3);
  EXPECT_TRUE(log.read_since("e1", 3).events.empty());
}

TEST(KvEventLogTest, ResetsWhenTheReaderFellOffTheRingOrTheEngineChanged) {
  KvEventLog log("e2", 4, 2);
  for (uint64_t h = 1; h <= 5; ++h) {
    log.record_stored({h});
  }
  log.record_cleared();
  log.record_stored({9});
  EXPECT_TRUE(log.read_since("e2", 1).reset);  // events 2..5 are gone
  EXPECT_FALSE(log.read_since("e2", 5).reset);
  KvEventsPage other = log.read_since("e1", 7);
  EXPECT_TRUE(other.reset);
  ASSERT_EQ(other.events.size(), 1u);
  EXPECT_EQ(other.events[0].hashes, (std::vector<uint64_t>{9}));  // cleared dropped the rest
  EXPECT_TRUE(log.read_since("e2", 99).reset);                    // ahead of the log
  EXPECT_EQ(log.num_held(), 1u);
}

}  // namespace
}  // namespace crescent::engine
