#pragma once
// The x16-interleaved panel layouts of the ggml block types, whichever family: the legacy types
// (legacy_x16.h) and the K-quants Q4_K / Q5_K / Q6_K (kquant_x16.h). One entry point for
// packing, the fallback row dots and the fingerprint's file-order rows.

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace crescent::kernels {

// Rows interleaved in one x16 group (a panel's rows, kPanelRows).
inline constexpr int64_t kX16Rows = 16;

// Whether `type` has an x16 layout (the kernel table decides whether a weight uses it).
bool has_x16_layout(DType type);
// Row `r` of a panel from / to the file's blocks; CHECK has_x16_layout(type) and
// 0 <= r < kX16Rows (the family functions behind these leave that check to them).
void store_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r, std::byte* panel);
void load_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r, std::byte* row);

}  // namespace crescent::kernels
