// AVX-512 dot / axpy over the f16, fp8_e4m3 and q8_0 KV cache rows, widened to f32 in
// registers (vcvtph2ps, a gather from the fp8 table, sign-extended int8 quants times each
// block's fp16 d); masked tails. Compiled with -mavx512*; only reached through the kernel table
// after cpuid said the CPU has these instructions.

#include <immintrin.h>

#include <algorithm>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"

namespace crescent::kernels::internal {
namespace {

inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << std::min<int64_t>(16, n)) - 1);
}

struct F16 {
  const uint16_t* p;
  __m512 load16(int64_t i, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + i));
  }
};

struct Fp8 {
  const uint8_t* p;
  const float* table;
  __m512 load16(int64_t i, __mmask16 m) const {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p + i));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, table, 4);
  }
};

template <typename L>
float dot_elems(const float* a, const L& b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), b.load16(i, 0xffff), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), b.load16(i + 16, 0xffff), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), b.load16(i, m), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

template <typename L>
void axpy_elems(float s, const L& x, float* y, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(vs, x.load16(i, m), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// 16 quants starting at q as f32.
inline __m512 q8_load16(const int8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

float dot_q8_0(const float* a, const Q8Block* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, a += kQ8BlockSize) {
    const int8_t* q = b[blk].quants;
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(a), q8_load16(q));
    t = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), q8_load16(q + 16), t);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(b[blk].scale_f16)), t, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void axpy_q8_0(float s, const Q8Block* x, float* y, int64_t n) {
  for (int64_t blk = 0; blk < n / kQ8BlockSize; ++blk, y += kQ8BlockSize) {
    const __m512 sd = _mm512_set1_ps(s * _cvtsh_ss(x[blk].scale_f16));
    const int8_t* q = x[blk].quants;
    _mm512_storeu_ps(y, _mm512_fmadd_ps(sd, q8_load16(q), _mm512_loadu_ps(y)));
    _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(sd, q8_load16(q + 16), _mm512_loadu_ps(y + 16)));
  }
}

#include "kernels/kv_dot_simd.inc"

}  // namespace

void fill_kv_avx512(KernelTable* t) {
  set_kv_ops(t);
}

}  // namespace crescent::kernels::internal
