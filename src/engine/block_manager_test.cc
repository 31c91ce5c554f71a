#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/kv_events.h"

namespace crescent::engine {
namespace {

Sequence make_seq(const std::string& id, std::vector<int32_t> tokens) {
  Sequence s;
  s.request_id = id;
  s.num_prompt_tokens = static_cast<int>(tokens.size());
  s.token_ids = std::move(tokens);
  return s;
}

std::vector<int32_t> iota_tokens(int n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Marks every token computed, as the engine does after a step.
void compute_all(BlockManager& bm, Sequence& s) {
  s.num_computed_tokens = s.num_tokens();
  bm.commit_computed(s);
}

void expect_ok(const BlockManager& bm, std::vector<const Sequence*> live) {
  Status s = bm.check_invariants(live);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(BlockManagerTest, AllocatesAndFreesWholeBlocks) {
  BlockManager bm(8, 4, true);
  Sequence a = make_seq("a", iota_tokens(9));  // 3 blocks
  ASSERT_TRUE(bm.can_allocate_for_prompt(a));
  EXPECT_EQ(bm.allocate_for_prompt(a), 0);
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  expect_ok(bm, {&a});
  compute_all(bm, a);
  a.token_ids.push_back(100);
  a.token_ids.push_back(101);
  a.token_ids.push_back(102);
  a.token_ids.push_back(103);  // 13 tokens: needs a 4th block
  ASSERT_TRUE(bm.can_append(a));
  bm.append_slots(a);
  EXPECT_EQ(a.block_table.size(), 4u);
  expect_ok(bm, {&a});
  bm.free(a);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.stats().num_blocks_used, 0);
  expect_ok(bm, {&a});
}

TEST(BlockManagerTest, ReusesCachedFullBlocksAndCountsHits) {
  BlockManager bm(16, 4, true);
  Sequence a = make_seq("a", iota_tokens(10));  // blocks [0..3] [4..7] full, [8, 9] partial
  bm.allocate_for_prompt(a);
  compute_all(bm, a);
  EXPECT_EQ(bm.stats().num_blocks_cached, 2);

  Sequence b = make_seq("b", iota_tokens(11));  // same first 10 tokens
  EXPECT_EQ(bm.allocate_for_prompt(b), 8);
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_NE(b.block_table[2], a.block_table[2]);  // the partial block is never shared
  EXPECT_EQ(bm.ref_count(BlockId(a.block_table[0])), 2);
  expect_ok(bm, {&a, &b});
  EXPECT_EQ(bm.stats().prefix_cache_queries_tokens, 10 + 11);
  EXPECT_EQ(bm.stats().prefix_cache_hits_tokens, 8);

  // A different first block breaks the chain even when the second block's tokens match.
  std::vector<int32_t> t = iota_tokens(10);
  t[0] = 99;
  Sequence c = make_seq("c", t);
  EXPECT_EQ(bm.allocate_for_prompt(c), 0);
  expect_ok(bm, {&a, &b, &c});
  bm.free(a);
  bm.free(b);
  bm.free(c);
  expect_ok(bm, {});
  EXPECT_EQ(bm.stats().num_blocks_used, 0);
}

TEST(BlockManagerTest, FullyCachedPromptStillComputesItsLastToken) {
  BlockManager bm(16, 4, true);
  Sequence a = make_seq("a", iota_tokens(8));
  bm.allocate_for_prompt(a);
  compute_all(bm, a);
  bm.free(a);
  Sequence b = make_seq("b", iota_tokens(8));
  // Both blocks are cached, but the last token's logits are needed: the last block is
  // recomputed into a block of b's own.
  EXPECT_EQ(bm.allocate_for_prompt(b), 4);
  EXPECT_EQ(b.block_table.size(), 2u);
  expect_ok(bm, {&b});
  Sequence c = make_seq("c", iota_tokens(9));
  EXPECT_EQ(bm.allocate_for_prompt(c), 8);
  expect_ok(bm, {&b, &c});
}

TEST(BlockManagerTest, PrefersNeverCachedBlocksThenEvictsLeastRecentlyUsed) {
  BlockManager bm(4, 2, true);
  Sequence a = make_seq("a", {1, 2, 3});  // block 0 full -> cached after compute
  bm.allocate_for_prompt(a);
  compute_all(bm, a);
  Sequence b = make_seq("b", {5, 6, 7});
  bm.allocate_for_prompt(b);
  compute_all(bm, b);
  const int32_t a_full = a.block_table[0];
  const int32_t b_full = b.block_table[0];
  bm.free(a);  // a's full block becomes the least recently used cached block
  bm.free(b);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_EQ(bm.stats().num_blocks_cached, 2);

  // Two fresh blocks: the never-cached ones are used, both cache entries survive.
  Sequence c = make_seq("c", {9, 9, 9});
  bm.allocate_for_prompt(c);
  EXPECT_NE(c.block_table[0], a_full);
  EXPECT_NE(c.block_table[1], a_full);
  EXPECT_NE(c.block_table[0], b_full);
  EXPECT_NE(c.block_table[1], b_full);
  EXPECT_EQ(bm.stats().num_blocks_cached, 2);
  // One more: evicts a's block (older), b's stays.
  Sequence d = make_seq("d", {8});
  bm.allocate_for_prompt(d);
  EXPECT_EQ(d.block_table[0], a_full);
  EXPECT_EQ(bm.stats().num_blocks_cached, 1);
  expect_ok(bm, {&c, &d});
  Sequence e = make_seq("e", {5, 6, 7});
  EXPECT_FALSE(bm.can_allocate_for_prompt(make_seq("x", {1, 2, 3, 4, 5})));
  ASSERT_FALSE(bm.can_allocate_for_prompt(e));  // needs b's block (free) + one more: none
  bm.free(d);
  ASSERT_TRUE(bm.can_allocate_for_prompt(e));
  EXPECT_EQ(bm.allocate_for_prompt(e), 2);
  EXPECT_EQ(e.block_table[0], b_full);
  expect_ok(bm, {&c, &e});
}

TEST(BlockManagerTest, SharedCachedBlockCostsNoFreeBlock) {
  BlockManager bm(3, 2, true);
  Sequence a = make_seq("a", {1, 2, 3});
  bm.allocate_for_prompt(a);
  compute_all(bm, a);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  Sequence b = make_seq("b", {1, 2, 4});  // shares a's first block, needs one new
  ASSERT_TRUE(bm.can_allocate_for_prompt(b));
  EXPECT_EQ(bm.allocate_for_prompt(b), 2);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  expect_ok(bm, {&a, &b});
}

TEST(BlockManagerTest, DisabledCacheNeverHits) {
  BlockManager bm(8, 2, false);
  Sequence a = make_seq("a", {1, 2, 3});
  bm.allocate_for_prompt(a);
  compute_all(bm, a);
  Sequence b = make_seq("b", {1, 2, 3});
  EXPECT_EQ(bm.allocate_for_prompt(b), 0);
  EXPECT_EQ(bm.stats().num_blocks_cached, 0);
  expect_ok(bm, {&a, &b});
}

TEST(BlockManagerTest, InvariantCheckCatchesAForgottenReference) {
  BlockManager bm(4, 2, true);
  Sequence a = make_seq("a", {1, 2, 3});
  bm.allocate_for_prompt(a);
  EXPECT_FALSE(bm.check_invariants({}).is_ok());  // a's references are unaccounted for
  Sequence copy = a;
  const Sequence* both[] = {&a, &copy};
  EXPECT_FALSE(bm.check_invariants(both).is_ok());  // one reference counted twice
}

}  // namespace
TEST(BlockManagerTest, ReportsStoredAndEvictedHashesOfTheSameChain) {
  KvEventLog log("e3", 4, 64);
  BlockManager bm(3, 4, true);
  bm.set_event_log(&log);
  Sequence a = make_seq("a", iota_tokens(9));  // 2 full blocks + 1 token
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

}  // namespace crescent::engine
