// Portable row dots for the ggml block types: each block is unpacked to its integer quants and
// integer scales, dotted exactly in int32 with the activation block, and scaled once per block
// (per super-block for the K-quants), like ggml's *_generic vec_dot functions.

#include <cstring>

#include "kernels/kernel_table.h"
#include "kernels/quant_unpack.h"

namespace crescent::kernels::internal {
namespace {

template <typename Block>
float dot_legacy_one(int64_t n, const void* w_row, const QuantizedActs& x) {
  const auto* w = static_cast<const Block*>(w_row);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    int8_t q[32];
    const LegacyScale s = unpack_legacy(w[b], q);
    const int8_t* xq = x.q8_0 + b * 32;
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i)
      dot += q[i] * xq[i];
    const float dx = x.q8_0_scale[b];
    acc += static_cast<float>(dot) * (s.d * dx) + s.m * dx * static_cast<float>(x.q8_0_sum[b]);
  }
  return acc;
}

template <typename Block>
float dot_k_one(int64_t n, const void* w_row, const QuantizedActs& x) {
  const auto* w = static_cast<const Block*>(w_row);
  float acc = 0;
  for (int64_t b = 0; b < n / kQKBlockSize; ++b) {
    int8_t q[kQKBlockSize];
    KScales s;
    unpack_k(w[b], q, &s);
    const BlockQ8K& y = x.q8_k[b];
    const int group = kQKBlockSize / s.num_groups;
    int32_t sumi = 0;
    int32_t summ = 0;
    for (int g = 0; g < s.num_groups; ++g) {
      int32_t dot = 0;
      for (int i = g * group; i < (g + 1) * group; ++i)
        dot += q[i] * y.qs[i];
      sumi += s.scale[g] * dot;
      int32_t bsum = 0;
      for (int j = g * group / 16; j < (g + 1) * group / 16; ++j)
        bsum += y.bsums[j];
      summ += s.min[g] * bsum;
    }
    acc += y.d * (s.d * static_cast<float>(sumi) - s.dmin * static_cast<float>(summ));
  }
  return acc;
}

template <typename Block>
void dot_legacy(int64_t n, const void* w_row, const QuantizedActs* x, int num_tokens, float* out) {
  for (int t = 0; t < num_tokens; ++t)
    out[t] = dot_legacy_one<Block>(n, w_row, x[t]);
}

template <typename Block>
void dot_k(int64_t n, const void* w_row, const QuantizedActs* x, int num_tokens, float* out) {
  for (int t = 0; t < num_tokens; ++t)
    out[t] = dot_k_one<Block>(n, w_row, x[t]);
}

}  // namespace

void fill_quant_portable(KernelTable* t) {
  t->row_dot[static_cast<int>(DType::kQ4_0)] = dot_legacy<BlockQ4_0>;
  t->row_dot[static_cast<int>(DType::kQ4_1)] = dot_legacy<BlockQ4_1>;
  t->row_dot[static_cast<int>(DType::kQ5_0)] = dot_legacy<BlockQ5_0>;
  t->row_dot[static_cast<int>(DType::kQ5_1)] = dot_legacy<BlockQ5_1>;
  t->row_dot[static_cast<int>(DType::kQ8_0)] = dot_legacy<Q8Block>;
  t->row_dot[static_cast<int>(DType::kIQ4_NL)] = dot_legacy<BlockIQ4_NL>;
  t->row_dot[static_cast<int>(DType::kQ2_K)] = dot_k<BlockQ2_K>;
  t->row_dot[static_cast<int>(DType::kQ3_K)] = dot_k<BlockQ3_K>;
  t->row_dot[static_cast<int>(DType::kQ4_K)] = dot_k<BlockQ4_K>;
  t->row_dot[static_cast<int>(DType::kQ5_K)] = dot_k<BlockQ5_K>;
  t->row_dot[static_cast<int>(DType::kQ6_K)] = dot_k<BlockQ6_K>;
}

}  // namespace crescent::kernels::internal
