#include "kernels/kquant_x16.h"

#include <array>
#include <cstring>

#include "core/check.h"
#include "kernels/x16.h"

namespace crescent::kernels {
namespace {

constexpr int64_t kRows = kX16Rows;

// One field of a block: where it sits in the file's block, how many bytes it has, how many of
// them stay together per row in the group (the run length), and where the group keeps it.
// Run k of the field is at in_group + k * run_stride (16 * run where the runs follow each other).
struct Field {
  int64_t in_block = 0;
  int64_t bytes = 0;
  int64_t run = 0;
  int64_t in_group = 0;
  int64_t run_stride = 0;
};
constexpr Field plain_field(int64_t in_block, int64_t bytes, int64_t run, int64_t in_group) {
  return {in_block, bytes, run, in_group, kRows * run};
}
struct BlockFields {
  int64_t block_bytes = 0;
  int num_fields = 0;
  std::array<Field, 8> fields;
};

BlockFields block_fields(DType type) {
  switch (type) {
    case DType::kQ2_K: {
      const KQuantX16Layout& l = kQ2KX16;
      return {sizeof(BlockQ2_K),
              4,
              {{plain_field(offsetof(BlockQ2_K, qs), 64, 4, l.qs),
                plain_field(offsetof(BlockQ2_K, scales), 16, 1, l.scales),
                plain_field(offsetof(BlockQ2_K, d), 2, 2, l.d),
                plain_field(offsetof(BlockQ2_K, dmin), 2, 2, l.dmin)}}};
    }
    case DType::kQ3_K: {
      const KQuantX16Layout& l = kQ3KX16;
      return {sizeof(BlockQ3_K),
              4,
              {{plain_field(offsetof(BlockQ3_K, qs), 64, 4, l.qs),
                plain_field(offsetof(BlockQ3_K, hmask), 32, 4, l.qh),
                plain_field(offsetof(BlockQ3_K, scales), 12, 1, l.scales),
                plain_field(offsetof(BlockQ3_K, d), 2, 2, l.d)}}};
    }
    case DType::kQ4_K: {
      const KQuantX16Layout& l = kQ4KX16;
      return {sizeof(BlockQ4_K),
              4,
              {{plain_field(offsetof(BlockQ4_K, qs), 128, 4, l.qs),
                plain_field(offsetof(BlockQ4_K, scales), 12, 1, l.scales),
                plain_field(offsetof(BlockQ4_K, d), 2, 2, l.d),
                plain_field(offsetof(BlockQ4_K, dmin), 2, 2, l.dmin)}}};
    }
    case DType::kQ5_K: {
      const KQuantX16Layout& l = kQ5KX16;
      return {sizeof(BlockQ5_K),
              5,
              {{plain_field(offsetof(BlockQ5_K, qs), 128, 4, l.qs),
                plain_field(offsetof(BlockQ5_K, qh), 32, 4, l.qh),
                plain_field(offsetof(BlockQ5_K, scales), 12, 1, l.scales),
                plain_field(offsetof(BlockQ5_K, d), 2, 2, l.d),
                plain_field(offsetof(BlockQ5_K, dmin), 2, 2, l.dmin)}}};
    }
    case DType::kQ6_K: {
      // Each 32-byte quarter of ql and half of qh is 8 runs, one per step of its half h.
      const KQuantX16Layout& l = kQ6KX16;
      constexpr int64_t kStep = kQ6KX16StepBytes;
      constexpr int64_t kHalf = 8 * kStep;
      const int64_t ql = offsetof(BlockQ6_K, ql);
      const int64_t qh = offsetof(BlockQ6_K, qh);
      return {sizeof(BlockQ6_K),
              8,
              {{{ql, 32, 4, l.qs, kStep},
                {ql + 32, 32, 4, l.qs + 64, kStep},
                {ql + 64, 32, 4, kHalf + l.qs, kStep},
                {ql + 96, 32, 4, kHalf + l.qs + 64, kStep},
                {qh, 32, 4, l.qh, kStep},
                {qh + 32, 32, 4, kHalf + l.qh, kStep},
                plain_field(offsetof(BlockQ6_K, scales), 16, 1, l.scales),
                plain_field(offsetof(BlockQ6_K, d), 2, 2, l.d)}}};
    }
    default:
      CRESCENT_CHECK(false) << dtype_name(type) << " has no x16 K-quant layout";
      return {};
  }
}

// Calls fn(offset in the block, offset in the group, bytes) for every run of row r's fields.
template <typename Fn>
void for_each_run(const BlockFields& f, int64_t r, Fn fn) {
  for (int i = 0; i < f.num_fields; ++i) {
    const Field& field = f.fields[i];
    for (int64_t k = 0; k < field.bytes / field.run; ++k) {
      fn(field.in_block + k * field.run, field.in_group + k * field.run_stride + r * field.run,
         static_cast<size_t>(field.run));
    }
  }
}

}  // namespace

bool is_kquant_x16_type(DType type) {
  return type == DType::kQ2_K || type == DType::kQ3_K || type == DType::kQ4_K ||
         type == DType::kQ5_K || type == DType::kQ6_K;
}

const KQuantX16Layout& kquant_x16_layout(DType type) {
  switch (type) {
    case DType::kQ2_K:
      return kQ2KX16;
    case DType::kQ3_K:
      return kQ3KX16;
    case DType::kQ4_K:
      return kQ4KX16;
    case DType::kQ5_K:
      return kQ5KX16;
    case DType::kQ6_K:
      return kQ6KX16;
    default:
      CRESCENT_CHECK(false) << dtype_name(type) << " has no x16 K-quant layout";
      return kQ4KX16;
  }
}

void store_kquant_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r,
                          std::byte* panel) {
  const BlockFields f = block_fields(type);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = row + b * f.block_bytes;
    std::byte* group = panel + b * kRows * f.block_bytes;
    for_each_run(f, r, [&](int64_t in_block, int64_t in_group, size_t n) {
      std::memcpy(group + in_group, block + in_block, n);
    });
  }
}

void load_kquant_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r,
                         std::byte* row) {
  const BlockFields f = block_fields(type);
  for (int64_t b = 0; b < num_blocks; ++b) {
    std::byte* block = row + b * f.block_bytes;
    const std::byte* group = panel + b * kRows * f.block_bytes;
    for_each_run(f, r, [&](int64_t in_block, int64_t in_group, size_t n) {
      std::memcpy(block + in_block, group + in_group, n);
    });
  }
}

}  // namespace crescent::kernels
