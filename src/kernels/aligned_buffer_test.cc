#include "kernels/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace crescent::kernels {
namespace {

TEST(GrowOnlyBufferTest, AlignedGrowsToTheLargestAndKeepsItsMemory) {
  GrowOnlyBuffer buffer;
  std::byte* first = buffer.reserve(1, "test");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  // Up to the rounded 64 bytes: the same memory.
  EXPECT_EQ(buffer.reserve(64, "test"), first);
  std::byte* grown = buffer.reserve(100000, "test");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(grown) % 64, 0u);
  std::memset(grown, 0xA5, 100000);  // every byte asked for is writable (ASan checks)
  // Smaller requests after growing keep the large buffer.
  EXPECT_EQ(buffer.reserve(10, "test"), grown);
  EXPECT_EQ(buffer.reserve(100000, "test"), grown);
}

}  // namespace
}  // namespace crescent::kernels
