#pragma once
// Internal to src/kernels: ggml's IQ4_NL quantiser (quants.cc's quantize_row dispatches to it).

#include <cstdint>

#include "core/dtype.h"

namespace crescent::kernels::internal {

// ggml's quantize_row_iq4_nl_ref without an importance matrix: per block of 32, the scale that
// minimises the x^2-weighted squared error over 15 candidate scales, then each value's nearest
// level of kIQ4NLValues.
void quantize_iq4_nl(const float* x, int64_t num_blocks, BlockIQ4_NL* y);

}  // namespace crescent::kernels::internal
