#pragma once
// The interleaved layout ("x16") of the K-quant types Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, where the
// active kernel table has their GEMV (the AVX512-BF16 one). The legacy types' counterpart and
// the reasons are in legacy_x16.h: a row dot over the file's layout spends its unpacking, scale
// decoding and scaling on every super-block of every row, more instructions than the memory's
// rate leaves it; interleaving super-block b of a panel's 16 rows lets each vector op serve all
// 16 rows.
//
// Every field of row r's super-block b moves to panel + b * 16 * sizeof(Block) (so a panel keeps
// its size), as runs of L bytes of the 16 rows: run k (bytes kL .. kL + L - 1 of the field) of
// row r sits at  run k's place + r * L.
// The quant fields (qs, ql, qh, hmask) have L = 4, so 4 quant bytes of each of the 16 rows fill
// a 64-byte line in the lane order of vpdpbusd; the scale bytes have L = 1 (byte k of the 16 rows
// in 16 bytes: one vpmovzxbd gives a 16-lane vector); d and dmin have L = 2 (16 f16, one
// vcvtph2ps). Runs follow each other (run k's place = field offset + k * 16 * L) except in
// Q6_K's quants:
//
//   Q2_K (1344 bytes): qs at 0, scales (16) at 1024, d at 1280, dmin at 1312
//   Q3_K (1760 bytes): qs at 0, hmask (32) at 1024, scales (12) at 1536, d at 1728
//   Q4_K (2304 bytes): qs at 0, scales (12) at 2048, d at 2240, dmin at 2272
//   Q5_K (2816 bytes): qs at 0, qh (32) at 2048, scales at 2560, d at 2752, dmin at 2784
//   Q6_K (3360 bytes): 16 steps of 192 bytes, step 8h + j (half h < 2, column run j < 8) =
//     ql run 16h + j, ql run 16h + 8 + j, qh run 8h + j (the lines one step of the kernel
//     reads, so it reads the group in order); scales (16) at 3072, d at 3328
//
// Thread-safety: none needed (each row's bytes are its own); rows are stored one at a time.

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace crescent::kernels {

// Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
bool is_kquant_x16_type(DType type);

// Offsets of the fields in a 16-row group; -1 where the type has no such field.
struct KQuantX16Layout {
  int64_t group_bytes = 0;
  int64_t qs = 0;   // Q4_K / Q5_K qs; Q6_K: its ql runs within a step (+ 64 for the second)
  int64_t qh = -1;  // Q5_K qh, Q3_K hmask; Q6_K: its qh run within a step
  int64_t scales = 0;
  int64_t d = 0;
  int64_t dmin = -1;
};
inline constexpr KQuantX16Layout kQ2KX16 = {int64_t{16} * 84, 0, -1, 1024, 1280, 1312};
inline constexpr KQuantX16Layout kQ3KX16 = {int64_t{16} * 110, 0, 1024, 1536, 1728, -1};
inline constexpr KQuantX16Layout kQ4KX16 = {int64_t{16} * 144, 0, -1, 2048, 2240, 2272};
inline constexpr KQuantX16Layout kQ5KX16 = {int64_t{16} * 176, 0, 2048, 2560, 2752, 2784};
inline constexpr KQuantX16Layout kQ6KX16 = {int64_t{16} * 210, 0, 128, 3072, 3328, -1};
inline constexpr int64_t kQ6KX16StepBytes = 192;
// CHECKs is_kquant_x16_type(type).
const KQuantX16Layout& kquant_x16_layout(DType type);

// Writes row `r` (< 16, which x16.h's entry points check) of a panel: `row` is that row's
// num_blocks super-blocks as in the file.
void store_kquant_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r,
                          std::byte* panel);
// The inverse: row `r` of an interleaved panel as num_blocks super-blocks as in the file.
void load_kquant_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r,
                         std::byte* row);

}  // namespace crescent::kernels
