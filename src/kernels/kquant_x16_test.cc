#include "kernels/kquant_x16.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/test_util.h"
#include "kernels/x16.h"

namespace crescent::kernels {
namespace {

constexpr DType kTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

TEST(KQuantX16Test, OnlyTheKQuantsQualify) {
  for (DType t : kTypes) {
    EXPECT_TRUE(is_kquant_x16_type(t)) << dtype_name(t);
    EXPECT_TRUE(has_x16_layout(t)) << dtype_name(t);
  }
  for (DType t : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kIQ4_NL}) {
    EXPECT_FALSE(is_kquant_x16_type(t)) << dtype_name(t);
  }
  EXPECT_FALSE(has_x16_layout(DType::kQ8_0));
  EXPECT_TRUE(has_x16_layout(DType::kQ5_0));
}

// The fields tile each group exactly: quants from 0, then the scales, d and dmin, ending at 16
// blocks' bytes.
TEST(KQuantX16Test, GroupsKeepTheBlocksBytes) {
  for (DType t : kTypes) {
    EXPECT_EQ(kquant_x16_layout(t).group_bytes, 16 * dtype_block_bytes(t)) << dtype_name(t);
  }
  EXPECT_EQ(kQ2KX16.scales, 16 * 64);
  EXPECT_EQ(kQ2KX16.d, 16 * (64 + 16));
  EXPECT_EQ(kQ2KX16.dmin + 32, kQ2KX16.group_bytes);
  EXPECT_EQ(kQ3KX16.qh, 16 * 64);
  EXPECT_EQ(kQ3KX16.scales, 16 * (64 + 32));
  EXPECT_EQ(kQ3KX16.d, 16 * (64 + 32 + 12));
  EXPECT_EQ(kQ3KX16.d + 32, kQ3KX16.group_bytes);
  EXPECT_EQ(kQ4KX16.scales, 16 * 128);
  EXPECT_EQ(kQ4KX16.d, 16 * (128 + 12));
  EXPECT_EQ(kQ4KX16.dmin + 32, kQ4KX16.group_bytes);
  EXPECT_EQ(kQ5KX16.qh, 16 * 128);
  EXPECT_EQ(kQ5KX16.scales, 16 * (128 + 32));
  EXPECT_EQ(kQ5KX16.dmin + 32, kQ5KX16.group_bytes);
  EXPECT_EQ(16 * kQ6KX16StepBytes, 16 * (128 + 64));
  EXPECT_EQ(kQ6KX16.scales, 16 * (128 + 64));
  EXPECT_EQ(kQ6KX16.d + 32, kQ6KX16.group_bytes);
}

// Every row of a panel of random super-blocks comes back bit for bit, and the panel holds the
// rows' bytes, each once (a permutation: the byte sums match per value).
TEST(KQuantX16Test, RowsRoundTripThroughAPanel) {
  const int64_t num_blocks = 3;
  for (DType t : kTypes) {
    const int64_t row_bytes = num_blocks * dtype_block_bytes(t);
    std::vector<std::vector<std::byte>> rows;
    std::vector<std::byte> panel(16 * row_bytes, std::byte{0});
    std::vector<int64_t> histogram_rows(256, 0);
    std::vector<int64_t> histogram_panel(256, 0);
    for (int r = 0; r < 16; ++r) {
      rows.push_back(testing::random_bytes(row_bytes, 200 + r));
      store_x16_row(t, rows[r].data(), num_blocks, r, panel.data());
      for (std::byte b : rows[r]) {
        ++histogram_rows[static_cast<int>(b)];
      }
    }
    for (int r = 0; r < 16; ++r) {
      std::vector<std::byte> back(row_bytes, std::byte{0x5a});
      load_x16_row(t, panel.data(), num_blocks, r, back.data());
      EXPECT_EQ(back, rows[r]) << dtype_name(t) << " row " << r;
    }
    for (std::byte b : panel) {
      ++histogram_panel[static_cast<int>(b)];
    }
    EXPECT_EQ(histogram_panel, histogram_rows) << dtype_name(t);
  }
}

// The documented places, byte by byte, on row 5 of the second super-block.
TEST(KQuantX16Test, FieldsLandWhereTheLayoutSays) {
  const int r = 5;
  {
    std::vector<BlockQ4_K> row(2);
    std::memset(row.data(), 0, sizeof(BlockQ4_K) * 2);
    row[1].qs[37] = 0xa7;  // run 9, byte 1
    row[1].scales[10] = 0x3c;
    row[1].d = 0x1234;
    row[1].dmin = 0x5678;
    std::vector<uint8_t> panel(2 * kQ4KX16.group_bytes, 0);
    store_kquant_x16_row(DType::kQ4_K, reinterpret_cast<const std::byte*>(row.data()), 2, r,
                         reinterpret_cast<std::byte*>(panel.data()));
    const uint8_t* g = panel.data() + kQ4KX16.group_bytes;
    EXPECT_EQ(g[9 * 64 + 4 * r + 1], 0xa7);
    EXPECT_EQ(g[2048 + 10 * 16 + r], 0x3c);
    EXPECT_EQ(g[2240 + 2 * r], 0x34);
    EXPECT_EQ(g[2240 + 2 * r + 1], 0x12);
    EXPECT_EQ(g[2272 + 2 * r], 0x78);
  }
  {
    std::vector<BlockQ6_K> row(2);
    std::memset(row.data(), 0, sizeof(BlockQ6_K) * 2);
    row[1].ql[127] = 0x9e;  // half 1, second ql run of step 8 + 7, byte 3
    row[1].qh[50] = 0x61;   // half 1, qh run of step 8 + 4, byte 2
    row[1].scales[15] = -3;
    row[1].d = 0x4321;
    std::vector<uint8_t> panel(2 * kQ6KX16.group_bytes, 0);
    store_kquant_x16_row(DType::kQ6_K, reinterpret_cast<const std::byte*>(row.data()), 2, r,
                         reinterpret_cast<std::byte*>(panel.data()));
    const uint8_t* g = panel.data() + kQ6KX16.group_bytes;
    EXPECT_EQ(g[15 * 192 + 64 + 4 * r + 3], 0x9e);
    EXPECT_EQ(g[12 * 192 + 128 + 4 * r + 2], 0x61);
    EXPECT_EQ(g[3072 + 15 * 16 + r], 0xfd);
    EXPECT_EQ(g[3328 + 2 * r], 0x21);
  }
  {
    std::vector<BlockQ2_K> row(2);
    std::memset(row.data(), 0, sizeof(BlockQ2_K) * 2);
    row[1].qs[45] = 0xc3;  // run 11, byte 1
    row[1].scales[14] = 0x5b;
    row[1].d = 0x2468;
    row[1].dmin = 0x1357;
    std::vector<uint8_t> panel(2 * kQ2KX16.group_bytes, 0);
    store_kquant_x16_row(DType::kQ2_K, reinterpret_cast<const std::byte*>(row.data()), 2, r,
                         reinterpret_cast<std::byte*>(panel.data()));
    const uint8_t* g = panel.data() + kQ2KX16.group_bytes;
    EXPECT_EQ(g[11 * 64 + 4 * r + 1], 0xc3);
    EXPECT_EQ(g[1024 + 14 * 16 + r], 0x5b);
    EXPECT_EQ(g[1280 + 2 * r], 0x68);
    EXPECT_EQ(g[1312 + 2 * r + 1], 0x13);
  }
  {
    std::vector<BlockQ3_K> row(2);
    std::memset(row.data(), 0, sizeof(BlockQ3_K) * 2);
    row[1].qs[62] = 0x4d;     // run 15, byte 2
    row[1].hmask[22] = 0xb1;  // run 5, byte 2
    row[1].scales[11] = 0x77;
    row[1].d = 0x0bcd;
    std::vector<uint8_t> panel(2 * kQ3KX16.group_bytes, 0);
    store_kquant_x16_row(DType::kQ3_K, reinterpret_cast<const std::byte*>(row.data()), 2, r,
                         reinterpret_cast<std::byte*>(panel.data()));
    const uint8_t* g = panel.data() + kQ3KX16.group_bytes;
    EXPECT_EQ(g[15 * 64 + 4 * r + 2], 0x4d);
    EXPECT_EQ(g[1024 + 5 * 64 + 4 * r + 2], 0xb1);
    EXPECT_EQ(g[1536 + 11 * 16 + r], 0x77);
    EXPECT_EQ(g[1728 + 2 * r], 0xcd);
  }
}

}  // namespace
}  // namespace crescent::kernels
