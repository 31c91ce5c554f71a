#include "engine/encoder_cache.h"

#include <gtest/gtest.h>

namespace crescent::engine {
namespace {

EncoderCache::Embeddings rows(int n) {
  return std::make_shared<const std::vector<float>>(static_cast<size_t>(n), 1.0f);
}

TEST(EncoderCacheTest, HitsMissesAndReferences) {
  EncoderCache cache(10);
  EXPECT_EQ(cache.acquire("a"), nullptr);
  ASSERT_TRUE(cache.can_insert(4));
  auto a = cache.insert("a", rows(4), 4);
  EXPECT_EQ(cache.acquire("a"), a);
  EncoderCacheStats s = cache.stats();
  EXPECT_EQ(s.num_hits, 1);
  EXPECT_EQ(s.num_misses, 1);
  EXPECT_EQ(s.num_referenced, 1);
  EXPECT_EQ(s.num_tokens_used, 4);
  cache.release("a");
  cache.release("a");
  EXPECT_EQ(cache.stats().num_referenced, 0);
  EXPECT_TRUE(cache.contains("a"));  // kept until room is needed
}

TEST(EncoderCacheTest, EvictsOnlyUnreferencedInLruOrder) {
  EncoderCache cache(10);
  cache.insert("a", rows(4), 4);
  cache.insert("b", rows(4), 4);
  cache.release("b");
  cache.release("a");  // a is now the most recently released
  // 4 more rows need one eviction: b (least recently used) goes.
  ASSERT_TRUE(cache.can_insert(4));
  cache.insert("c", rows(4), 4);
  EXPECT_FALSE(cache.contains("b"));
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_EQ(cache.stats().num_evictions, 1);
  // c is referenced: 10 rows cannot fit beside it, 6 can (evicting a).
  EXPECT_FALSE(cache.can_insert(10));
  ASSERT_TRUE(cache.can_insert(6));
  cache.insert("d", rows(6), 6);
  EXPECT_FALSE(cache.contains("a"));
  EXPECT_TRUE(cache.contains("c"));
  EXPECT_EQ(cache.stats().num_tokens_used, 10);
  // Everything referenced: nothing fits, nothing is evicted.
  EXPECT_FALSE(cache.can_insert(1));
}

TEST(EncoderCacheTest, ReacquireTakesEntryOffTheEvictionList) {
  EncoderCache cache(8);
  cache.insert("a", rows(4), 4);
  cache.release("a");
  ASSERT_NE(cache.acquire("a"), nullptr);
  EXPECT_FALSE(cache.can_insert(8));  // a is referenced again
  EXPECT_TRUE(cache.can_insert(4));
}

}  // namespace
}  // namespace crescent::engine
