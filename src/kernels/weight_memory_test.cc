#include "kernels/weight_memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace crescent::kernels {
namespace {

bool all_zero(const std::byte* p, int64_t n) {
  return std::all_of(p, p + n, [](std::byte b) { return b == std::byte{0}; });
}

TEST(WeightMemoryTest, BlocksAreAlignedZeroedAndDisjoint) {
  std::vector<std::pair<std::shared_ptr<std::byte>, int64_t>> blocks;
  for (int64_t n : {1, 63, 64, 65, 4096, 100000, 3 << 20}) {
    auto p = allocate_weight_memory(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << n;
    EXPECT_TRUE(all_zero(p.get(), n)) << n;
    std::memset(p.get(), 0xA5, static_cast<size_t>(n));  // every byte is writable
    blocks.emplace_back(std::move(p), n);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const auto* a = blocks[i].first.get();
      const auto* b = blocks[j].first.get();
      EXPECT_TRUE(a + blocks[i].second <= b || b + blocks[j].second <= a) << i << " " << j;
    }
  }
}

#if !defined(__SANITIZE_ADDRESS__)
// The arena's bookkeeping (ASan builds allocate each block on the heap instead).
TEST(WeightMemoryTest, ChunksGoWithTheirLastWeightAndReusedMemoryIsZeroed) {
  const WeightMemoryStats before = weight_memory_stats();
  {
    auto big = allocate_weight_memory(int64_t{20} << 20);  // past 16 MiB: a chunk of its own
    EXPECT_EQ(weight_memory_stats().chunks, before.chunks + 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big.get()) % (2 << 20), 0u);  // huge-page aligned
  }
  EXPECT_EQ(weight_memory_stats().chunks, before.chunks);

  // Small weights share a chunk; once they are all gone the chunk is carved again from its
  // start (when nothing else of this process lives in it), and what was written there reads as
  // zero.
  const bool chunk_was_empty = weight_memory_stats().current_chunk_live == 0;
  std::byte* first = nullptr;
  {
    auto a = allocate_weight_memory(1000);
    auto b = allocate_weight_memory(1000);
    EXPECT_GE(weight_memory_stats().current_chunk_live, 2);
    first = a.get();
    std::memset(a.get(), 0xFF, 1000);
    std::memset(b.get(), 0xFF, 1000);
  }
  auto again = allocate_weight_memory(2000);
  if (chunk_was_empty) {
    EXPECT_EQ(again.get(), first);
  }
  EXPECT_TRUE(all_zero(again.get(), 2000));
  EXPECT_LE(weight_memory_stats().chunks, before.chunks + 1);

  // Transient weights come from the heap: no chunk, no arena block.
  const WeightMemoryStats arena_before = weight_memory_stats();
  auto transient = allocate_weight_memory(5000, WeightStorage::kTransient);
  EXPECT_TRUE(all_zero(transient.get(), 5000));
  EXPECT_EQ(weight_memory_stats().chunks, arena_before.chunks);
  EXPECT_EQ(weight_memory_stats().current_chunk_live, arena_before.current_chunk_live);
}

TEST(WeightMemoryTest, AFullChunkIsReplacedAndFreedWhenItsWeightsGo) {
  const int64_t chunks_before = weight_memory_stats().chunks;
  std::vector<std::shared_ptr<std::byte>> weights;
  for (int i = 0; i < 10; ++i)  // 10 x 15 MiB: more than one 64 MiB chunk holds
    weights.push_back(allocate_weight_memory(int64_t{15} << 20));
  EXPECT_GE(weight_memory_stats().chunks, chunks_before + 2);
  weights.clear();
  EXPECT_LE(weight_memory_stats().chunks, chunks_before + 1);  // at most the arena's current one
}
#endif

}  // namespace
}  // namespace crescent::kernels
