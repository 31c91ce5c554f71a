#include "engine/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "engine/block_manager.h"

namespace crescent::engine {
namespace {

Sequence make_seq(const std::string& id, std::vector<int32_t> tokens) {
  Sequence s;
  s.request_id = id;
  s.num_prompt_tokens = static_cast<int>(tokens.size());
  s.token_ids = std::move(tokens);
  return s;
}

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

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

TEST(KvEventLogTest, BlockManagerReportsStoredAndEvictedHashesOfTheSameChain) {
  KvEventLog log("e3", 4, 64);
  BlockManager bm(3, 4, true);
  bm.set_event_log(&log);
  Sequence a = make_seq("a", iota_tokens(9, 0));  // 2 full blocks + 1 token
  ASSERT_TRUE(bm.can_allocate_for_prompt(a));
  bm.allocate_for_prompt(a);
  a.num_computed_tokens = a.num_tokens();
  bm.commit_computed(a);
  KvEventsPage page = log.read_since("e3", 0);
  ASSERT_EQ(page.events.size(), 1u);
  EXPECT_EQ(page.events[0].hashes, prefix_block_hashes(a.token_ids, 4));
  EXPECT_EQ(prefix_block_hashes(a.token_ids, 4), a.block_hashes);
  bm.free(a);

  // A different prompt needs all 3 blocks: both cached ones are evicted.
  Sequence b = make_seq("b", iota_tokens(12, 100));
  ASSERT_TRUE(bm.can_allocate_for_prompt(b));
  bm.allocate_for_prompt(b);
  KvEventsPage after = log.read_since("e3", page.seq);
  ASSERT_EQ(after.events.size(), 2u);
  for (const KvEvent& e : after.events) {
    EXPECT_EQ(e.type, KvEventType::kRemoved);
  }
  EXPECT_EQ(log.num_held(), 0u);
  bm.free(b);
}

}  // namespace
}  // namespace crescent::engine
