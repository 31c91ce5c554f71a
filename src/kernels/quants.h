#pragma once
// ggml's block-quantised weight types (Q4_0 ... Q6_K, see core/dtype.h for the layouts): the
// reference quantisers (ggml-quants.c's quantize_row_*_ref, value for value), and the activation
// quantisation each type's dot product pairs with (Q8_K for the K-quants, Q8_0 for Q4_0/Q5_0/
// Q8_0, Q8_0 plus block sums, i.e. ggml's Q8_1, for Q4_1/Q5_1).
//
// Thread-safety: pure functions.

#include <cstdint>

#include "core/dtype.h"

namespace crescent::kernels {

// Quantises num_values floats (a multiple of dtype_block_size(dtype)) to `dtype`, writing
// dtype_num_bytes(dtype, num_values) bytes at out. dtype must be block-quantised.
void quantize_row(DType dtype, const float* x, int64_t num_values, void* out);

// ggml's Q8_K activation block: 256 int8 values, f32 scale, sums of each 16 quants.
struct BlockQ8K {
  float d;
  int8_t qs[kQKBlockSize];
  int16_t bsums[kQKBlockSize / 16];
};
// ggml's quantize_row_q8_K_ref: d = max / -127 of the value with the largest magnitude.
void quantize_row_q8_k(const float* x, int64_t num_values, BlockQ8K* out);

// The activation side of one row dot product: Q8_0 blocks of 32 (quants, scale, sum of quants)
// for the legacy types, Q8_K blocks for the K-quants.
struct QuantizedActs {
  const int8_t* q8_0 = nullptr;
  const float* q8_0_scale = nullptr;
  const int32_t* q8_0_sum = nullptr;
  const BlockQ8K* q8_k = nullptr;
};
// Whether `dtype`'s dot partner is Q8_K (true for Q2_K ... Q6_K).
constexpr bool dots_with_q8_k(DType dtype) {
  return dtype_block_size(dtype) == kQKBlockSize;
}

// sum_i w[i] * x[i] over num_values values of one weight row of `dtype` (int32 block dots,
// f32 accumulation across blocks), on the active ISA's kernel.
float quant_row_dot(DType dtype, int64_t num_values, const void* w_row, const QuantizedActs& x);

}  // namespace crescent::kernels
