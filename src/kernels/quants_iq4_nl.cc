// Transcribed from ggml-quants.c's quantize_row_iq4_nl_impl for IQ4_NL's shape (super-block =
// block = 32 values, 7 tries each side, no importance matrix), in ggml's arithmetic order.

#include "kernels/quants_iq4_nl.h"

#include <cmath>
#include <cstring>

namespace crescent::kernels::internal {
namespace {

constexpr int kBlock = 32;
constexpr int kTries = 7;
constexpr float kGroupMaxEps = 1e-15f;

// The index of the level nearest to x (ties to the upper one), as ggml's best_index_int8.
int best_index(float x) {
  const int8_t* val = kIQ4NLValues;
  if (x <= val[0]) {
    return 0;
  }
  if (x >= val[15]) {
    return 15;
  }
  int ml = 0;
  int mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) {
      mu = mav;
    } else {
      ml = mav;
    }
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// sum w * q * x and sum w * q^2 over the block with the levels nearest to id * x.
void weighted_sums(const float* x, const float* weight, float id, float* sumqx, float* sumq2) {
  *sumqx = 0;
  *sumq2 = 0;
  for (int j = 0; j < kBlock; ++j) {
    const float q = kIQ4NLValues[best_index(id * x[j])];
    const float w = weight[j];
    *sumqx += w * q * x[j];
    *sumq2 += w * q * q;
  }
}

}  // namespace

void quantize_iq4_nl(const float* x, int64_t num_blocks, BlockIQ4_NL* y) {
  for (int64_t i = 0; i < num_blocks; ++i, x += kBlock) {
    float weight[kBlock];
    float amax = 0;
    float max = 0;
    for (int j = 0; j < kBlock; ++j) {
      weight[j] = x[j] * x[j];
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    float scale = 0;
    if (amax >= kGroupMaxEps) {
      float d = -max / kIQ4NLValues[0];
      float sumqx;
      float sumq2;
      weighted_sums(x, weight, 1 / d, &sumqx, &sumq2);
      d = sumqx / sumq2;
      float best = d * sumqx;
      for (int itry = -kTries; itry <= kTries; ++itry) {
        weighted_sums(x, weight, (itry + kIQ4NLValues[0]) / max, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
          d = sumqx / sumq2;
          best = d * sumqx;
        }
      }
      scale = d;
    }
    y[i].d = float_to_f16(scale);
    const float id = scale != 0 ? 1 / scale : 0.0f;
    uint8_t levels[kBlock];
    for (int j = 0; j < kBlock; ++j) {
      levels[j] = static_cast<uint8_t>(best_index(id * x[j]));
    }
    for (int j = 0; j < 16; ++j) {
      y[i].qs[j] = static_cast<uint8_t>(levels[j] | (levels[j + 16] << 4));
    }
  }
}

}  // namespace crescent::kernels::internal
