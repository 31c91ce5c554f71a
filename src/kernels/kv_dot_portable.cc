// Portable dot / axpy over the f16, fp8_e4m3 and q8_0 KV cache rows: scalar widening to f32.

#include <cmath>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"

namespace crescent::kernels::internal {
namespace {

float dot_f16(const float* a, const uint16_t* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += a[i] * f16_to_float(b[i]);
  return s;
}

void axpy_f16(float s, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = std::fma(s, f16_to_float(x[i]), y[i]);
}

float dot_fp8(const float* a, const uint8_t* b, int64_t n) {
  const float* table = fp8_e4m3_table();
  float s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += a[i] * table[b[i]];
  return s;
}

void axpy_fp8(float s, const uint8_t* x, float* y, int64_t n) {
  const float* table = fp8_e4m3_table();
  for (int64_t i = 0; i < n; ++i)
    y[i] = std::fma(s, table[x[i]], y[i]);
}

float dot_q8_0(const float* a, const Q8Block* b, int64_t n) {
  float s = 0;
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, a += kQ8BlockSize) {
    float t = 0;
    for (int j = 0; j < kQ8BlockSize; ++j)
      t += a[j] * static_cast<float>(b[blk].quants[j]);
    s += f16_to_float(b[blk].scale_f16) * t;
  }
  return s;
}

void axpy_q8_0(float s, const Q8Block* x, float* y, int64_t n) {
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, y += kQ8BlockSize) {
    const float sd = s * f16_to_float(x[blk].scale_f16);
    for (int j = 0; j < kQ8BlockSize; ++j)
      y[j] = std::fma(sd, static_cast<float>(x[blk].quants[j]), y[j]);
  }
}

}  // namespace

void fill_kv_portable(KernelTable* t) {
  t->dot_f16 = dot_f16;
  t->axpy_f16 = axpy_f16;
  t->dot_fp8 = dot_fp8;
  t->axpy_fp8 = axpy_fp8;
  t->dot_q8_0 = dot_q8_0;
  t->axpy_q8_0 = axpy_q8_0;
}

}  // namespace crescent::kernels::internal
