#pragma once
// The interleaved layout ("x16") the legacy ggml block types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL)
// are stored in where the active kernel table has their GEMV: the AVX512-BF16 one (CPUs with
// AVX512-BF16 and AVX512-VNNI; VNNI-only CPUs keep the file's rows and the AVX2 row dots).
//
// Why: batch-1 decode reads each weight once per token, so each 18-24 byte block must be
// consumed in the time memory takes to deliver it. A row dot over the file's layout spends its
// instructions per block (unpack 32 values, one vpdpbusd, convert, scale): ~3.5 cycles a block,
// below the memory's rate. Interleaving block b of a panel's 16 rows puts 4 quants of each row
// in one 32-bit lane of a zmm, so one vpdpbusd serves 16 rows, the scale multiply is one vector
// op per 16 blocks, and the unpacking works on 64 bytes at a time. The prefill GEMM's unpacked
// panels (gemm_ggml_avx512vnni.cc) use the same lane order, so unpacking them is a few stores.
//
// Layout of block b of a 16-row panel, at panel + b * 16 * sizeof(Block) (the same bytes as the
// 16 rows' blocks b, so a panel's size does not change):
//   qs   [4][16][4] u8 at 0:   [j][r][e] = byte 4j + e of row r's qs (values 4j+e low nibble,
//                               16+4j+e high nibble)
//   d    [16] f16 at 256
//   m    [16] f16 at 288       (Q4_1 / Q5_1)
//   qh   [8] u64 after them    (Q5_0 / Q5_1): bit 4r + e of mask j = bit 4j + e of row r's qh,
//                               the fifth bit of value 4j + e (a zmm byte mask for column run j)
// Column run j (values 4j..4j+3 of every row, j < 8) is thus (qs[j % 4] >> (4 * (j / 4))) & 15,
// plus 16 where mask j is set.
//
// Thread-safety: no shared state, but the 16 rows of one panel share its qh masks (each store
// read-modify-writes them), so rows of one panel must be stored one after another.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace crescent::kernels {

// Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL: 32 values per block, one scale (and a min, or a fifth bit).
bool is_legacy_block_type(DType type);

// What a legacy block type carries besides d and qs: a min m (Q4_1 / Q5_1), a fifth bit per
// value in qh (Q5_0 / Q5_1), or IQ4_NL's 16 non-uniform levels. For the kernels' templates.
template <typename Block>
struct LegacyBlockTraits {
  static constexpr bool kHasMin = requires(Block blk) { blk.m; };
  static constexpr bool kHasHigh = requires(Block blk) { blk.qh; };
  static constexpr bool kNonLinear = std::is_same_v<Block, BlockIQ4_NL>;
};

struct LegacyX16Layout {
  int64_t group_bytes = 0;  // one block of all 16 rows
  int64_t d_offset = 256;
  int64_t m_offset = -1;   // -1: no min
  int64_t qh_offset = -1;  // -1: no fifth bits
};
// The layout above for a block of `block_bytes` with or without m and qh; the one place its
// offsets are computed (the kernels read it at compile time through legacy_x16_layout_of).
constexpr LegacyX16Layout legacy_x16_layout(int64_t block_bytes, bool has_min, bool has_high) {
  LegacyX16Layout l;
  l.group_bytes = 16 * block_bytes;
  int64_t next = l.d_offset + 2 * 16;
  if (has_min) {
    l.m_offset = next;
    next += 2 * 16;
  }
  if (has_high) {
    l.qh_offset = next;
    next += 8 * 8;
  }
  return next == l.group_bytes ? l : LegacyX16Layout{};  // group_bytes 0: fields do not fit
}
template <typename Block>
constexpr LegacyX16Layout legacy_x16_layout_of() {
  constexpr LegacyX16Layout l = legacy_x16_layout(sizeof(Block), LegacyBlockTraits<Block>::kHasMin,
                                                  LegacyBlockTraits<Block>::kHasHigh);
  static_assert(l.group_bytes == 16 * static_cast<int64_t>(sizeof(Block)));
  return l;
}
// CHECKs is_legacy_block_type(type).
LegacyX16Layout legacy_x16_layout(DType type);

// Writes row `r` (< 16, which x16.h's entry points check) of a panel: `row` is that row's
// num_blocks blocks in the file's layout.
void store_legacy_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r,
                          std::byte* panel);
// The inverse: row `r` of an interleaved panel as num_blocks blocks in the file's layout.
void load_legacy_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r,
                         std::byte* row);

}  // namespace crescent::kernels
