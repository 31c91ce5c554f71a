// AVX2 + F16C dot / axpy over the f16, fp8_e4m3 and q8_0 KV cache rows, widened to f32 in
// registers: f16 by vcvtph2ps, fp8 by a gather from the 256-entry table, q8_0 by sign-extending
// the int8 quants and scaling each block of 32 by its fp16 d. Compiled with -mavx2 -mfma -mf16c;
// only reached through the kernel table after cpuid said the CPU has these instructions.

#include <immintrin.h>

#include <cmath>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"

namespace crescent::kernels::internal {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct F16 {
  const uint16_t* p;
  __m256 load8(int64_t i) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
  }
  float at(int64_t i) const { return f16_to_float(p[i]); }
};

struct Fp8 {
  const uint8_t* p;
  const float* table;
  __m256 load8(int64_t i) const {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i));
    return _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(b), 4);
  }
  float at(int64_t i) const { return table[p[i]]; }
};

template <typename L>
float dot_elems(const float* a, const L& b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b.load8(i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b.load8(i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i)
    s += a[i] * b.at(i);
  return s;
}

template <typename L>
void axpy_elems(float s, const L& x, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, x.load8(i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i)
    y[i] = std::fma(s, x.at(i), y[i]);
}

// 8 quants starting at q as f32.
inline __m256 q8_load8(const int8_t* q) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

float dot_q8_0(const float* a, const Q8Block* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, a += kQ8BlockSize) {
    const int8_t* q = b[blk].quants;
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(a), q8_load8(q));
    t = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), q8_load8(q + 8), t);
    t = _mm256_fmadd_ps(_mm256_loadu_ps(a + 16), q8_load8(q + 16), t);
    t = _mm256_fmadd_ps(_mm256_loadu_ps(a + 24), q8_load8(q + 24), t);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[blk].scale_f16)), t, acc);
  }
  return hsum(acc);
}

void axpy_q8_0(float s, const Q8Block* x, float* y, int64_t n) {
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, y += kQ8BlockSize) {
    const __m256 sd = _mm256_set1_ps(s * _cvtsh_ss(x[blk].scale_f16));
    const int8_t* q = x[blk].quants;
    for (int j = 0; j < kQ8BlockSize; j += 8)
      _mm256_storeu_ps(y + j, _mm256_fmadd_ps(sd, q8_load8(q + j), _mm256_loadu_ps(y + j)));
  }
}

#include "kernels/kv_dot_simd.inc"

}  // namespace

void fill_kv_avx2(KernelTable* t) {
  set_kv_ops(t);
}

}  // namespace crescent::kernels::internal
