#include "kernels/legacy_x16.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

constexpr DType kLegacyTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                  DType::kIQ4_NL};

TEST(LegacyX16Test, OnlyTheLegacyTypesQualify) {
  for (DType t : kLegacyTypes) {
    EXPECT_TRUE(is_legacy_block_type(t)) << dtype_name(t);
  }
  for (DType t : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    EXPECT_FALSE(is_legacy_block_type(t)) << dtype_name(t);
  }
}

TEST(LegacyX16Test, GroupsKeepTheBlocksBytes) {
  for (DType t : kLegacyTypes) {
    const LegacyX16Layout l = legacy_x16_layout(t);
    EXPECT_EQ(l.group_bytes, 16 * dtype_block_bytes(t)) << dtype_name(t);
    EXPECT_EQ(l.d_offset, 256);
  }
  EXPECT_EQ(legacy_x16_layout(DType::kQ5_0).qh_offset, 288);
  EXPECT_EQ(legacy_x16_layout(DType::kQ5_1).m_offset, 288);
  EXPECT_EQ(legacy_x16_layout(DType::kQ5_1).qh_offset, 320);
  EXPECT_EQ(legacy_x16_layout(DType::kQ4_0).qh_offset, -1);
}

// Every row of a panel of random blocks comes back bit for bit, and the panel's bytes are a
// permutation of the rows' (nothing lost, nothing from elsewhere).
TEST(LegacyX16Test, RowsRoundTripThroughAPanel) {
  const int64_t num_blocks = 7;
  for (DType t : kLegacyTypes) {
    const int64_t row_bytes = num_blocks * dtype_block_bytes(t);
    std::vector<std::vector<std::byte>> rows;
    std::vector<std::byte> panel(16 * row_bytes, std::byte{0});
    for (int r = 0; r < 16; ++r) {
      rows.push_back(testing::random_bytes(row_bytes, 100 + r));
      store_legacy_x16_row(t, rows[r].data(), num_blocks, r, panel.data());
    }
    int64_t ones_in_rows = 0;
    int64_t ones_in_panel = 0;
    for (int r = 0; r < 16; ++r) {
      std::vector<std::byte> back(row_bytes, std::byte{0x5a});
      load_legacy_x16_row(t, panel.data(), num_blocks, r, back.data());
      EXPECT_EQ(back, rows[r]) << dtype_name(t) << " row " << r;
      for (std::byte b : rows[r]) {
        ones_in_rows += __builtin_popcount(static_cast<unsigned>(b));
      }
    }
    for (std::byte b : panel) {
      ones_in_panel += __builtin_popcount(static_cast<unsigned>(b));
    }
    EXPECT_EQ(ones_in_panel, ones_in_rows) << dtype_name(t);
  }
}

// The documented places, checked field by field on Q5_1 (it has every field).
TEST(LegacyX16Test, FieldsLandWhereTheLayoutSays) {
  const int64_t num_blocks = 2;
  std::vector<BlockQ5_1> row(num_blocks);
  std::memset(row.data(), 0, sizeof(BlockQ5_1) * num_blocks);
  BlockQ5_1& blk = row[1];
  blk.d = 0x1234;
  blk.m = 0xabcd;
  for (int i = 0; i < 16; ++i) {
    blk.qs[i] = static_cast<uint8_t>(i * 17);
  }
  const uint32_t qh = 0x8000'0021;  // values 0, 5 and 31 have a fifth bit
  std::memcpy(blk.qh, &qh, 4);
  const int r = 9;
  const int64_t r64 = r;
  const LegacyX16Layout l = legacy_x16_layout(DType::kQ5_1);
  std::vector<uint8_t> panel(num_blocks * l.group_bytes, 0);
  store_legacy_x16_row(DType::kQ5_1, reinterpret_cast<const std::byte*>(row.data()), num_blocks, r,
                       reinterpret_cast<std::byte*>(panel.data()));
  const uint8_t* g = panel.data() + l.group_bytes;  // block 1
  for (int64_t j = 0; j < 4; ++j) {
    for (int64_t e = 0; e < 4; ++e) {
      EXPECT_EQ(g[j * 64 + 4 * r64 + e], blk.qs[4 * j + e]) << j << " " << e;
    }
  }
  uint16_t d;
  uint16_t m;
  std::memcpy(&d, g + l.d_offset + 2 * r64, 2);
  std::memcpy(&m, g + l.m_offset + 2 * r64, 2);
  EXPECT_EQ(d, 0x1234);
  EXPECT_EQ(m, 0xabcd);
  uint64_t mask[8];
  std::memcpy(mask, g + l.qh_offset, sizeof(mask));
  // Value 4j + e's fifth bit is bit 4r + e of mask j.
  EXPECT_EQ(mask[0], uint64_t{0b0001} << (4 * r));  // value 0
  EXPECT_EQ(mask[1], uint64_t{0b0010} << (4 * r));  // value 5
  EXPECT_EQ(mask[7], uint64_t{0b1000} << (4 * r));  // value 31
  for (int j = 2; j < 7; ++j) {
    EXPECT_EQ(mask[j], 0u) << j;
  }
}

}  // namespace
}  // namespace crescent::kernels
