#include "kernels/legacy_x16.h"

#include <cstring>

#include "core/check.h"
#include "kernels/x16.h"

namespace crescent::kernels {
namespace {

constexpr int64_t kRows = kX16Rows;

// Where one block's fields sit in the file's layout (ggml's block structs, dtype.h).
struct BlockFields {
  int64_t block_bytes = 0;
  int64_t d = 0;
  int64_t m = -1;
  int64_t qh = -1;
  int64_t qs = 0;
};

BlockFields block_fields(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return {sizeof(BlockQ4_0), offsetof(BlockQ4_0, d), -1, -1, offsetof(BlockQ4_0, qs)};
    case DType::kQ4_1:
      return {sizeof(BlockQ4_1), offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m), -1,
              offsetof(BlockQ4_1, qs)};
    case DType::kQ5_0:
      return {sizeof(BlockQ5_0), offsetof(BlockQ5_0, d), -1, offsetof(BlockQ5_0, qh),
              offsetof(BlockQ5_0, qs)};
    case DType::kQ5_1:
      return {sizeof(BlockQ5_1), offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m),
              offsetof(BlockQ5_1, qh), offsetof(BlockQ5_1, qs)};
    case DType::kIQ4_NL:
      return {sizeof(BlockIQ4_NL), offsetof(BlockIQ4_NL, d), -1, -1, offsetof(BlockIQ4_NL, qs)};
    default:
      CRESCENT_CHECK(false) << dtype_name(type) << " is not a legacy block type";
      return {};
  }
}

// Calls fn(offset in the block, offset in the group, bytes) for the byte-copied fields of row
// r's block: qs in four runs, d, and m.
template <typename Fn>
void for_each_copied_field(const BlockFields& f, const LegacyX16Layout& l, int64_t r, Fn fn) {
  for (int64_t j = 0; j < 4; ++j) {
    fn(f.qs + 4 * j, j * 4 * kRows + 4 * r, 4);
  }
  fn(f.d, l.d_offset + 2 * r, 2);
  if (f.m >= 0) {
    fn(f.m, l.m_offset + 2 * r, 2);
  }
}

}  // namespace

bool is_legacy_block_type(DType type) {
  return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ5_0 ||
         type == DType::kQ5_1 || type == DType::kIQ4_NL;
}

LegacyX16Layout legacy_x16_layout(DType type) {
  const BlockFields f = block_fields(type);
  const LegacyX16Layout l = legacy_x16_layout(f.block_bytes, f.m >= 0, f.qh >= 0);
  CRESCENT_CHECK(l.group_bytes == kRows * f.block_bytes) << dtype_name(type);
  return l;
}

void store_legacy_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r,
                          std::byte* panel) {
  const BlockFields f = block_fields(type);
  const LegacyX16Layout l = legacy_x16_layout(type);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = row + b * f.block_bytes;
    std::byte* group = panel + b * l.group_bytes;
    for_each_copied_field(f, l, r, [&](int64_t in_block, int64_t in_group, size_t n) {
      std::memcpy(group + in_group, block + in_block, n);
    });
    if (f.qh < 0) {
      continue;
    }
    // Bits 4j..4j+3 of the row's qh become bits 4r..4r+3 of mask j.
    uint32_t qh;
    std::memcpy(&qh, block + f.qh, 4);
    for (int64_t j = 0; j < 8; ++j) {
      std::byte* at = group + l.qh_offset + 8 * j;
      uint64_t mask;
      std::memcpy(&mask, at, 8);
      mask = (mask & ~(uint64_t{0xf} << (4 * r))) | (uint64_t{(qh >> (4 * j)) & 0xfu} << (4 * r));
      std::memcpy(at, &mask, 8);
    }
  }
}

void load_legacy_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r,
                         std::byte* row) {
  const BlockFields f = block_fields(type);
  const LegacyX16Layout l = legacy_x16_layout(type);
  for (int64_t b = 0; b < num_blocks; ++b) {
    std::byte* block = row + b * f.block_bytes;
    const std::byte* group = panel + b * l.group_bytes;
    for_each_copied_field(f, l, r, [&](int64_t in_block, int64_t in_group, size_t n) {
      std::memcpy(block + in_block, group + in_group, n);
    });
    if (f.qh < 0) {
      continue;
    }
    uint32_t qh = 0;
    for (int64_t j = 0; j < 8; ++j) {
      uint64_t mask;
      std::memcpy(&mask, group + l.qh_offset + 8 * j, 8);
      qh |= static_cast<uint32_t>((mask >> (4 * r)) & 0xf) << (4 * j);
    }
    std::memcpy(block + f.qh, &qh, 4);
  }
}

}  // namespace crescent::kernels
