// AVX2 + FMA + F16C implementations: f32 math on F32 and BF16 weights and int8 dots on Q8_0
// weights (one 16-row panel as two 8-lane halves), vector ops for norms, activations and attention.
// Compiled with -mavx2 -mfma -mf16c; only reached through the kernel table after cpuid said the CPU
// has them.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/avx2_math.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Writes one token's 16 row sums (two 8-row halves) plus the bias to the panel's rows of y
// (fewer in the last panel).
void store_panel_rows(const MatmulArgs& a, int64_t panel, int64_t token, __m256 lo, __m256 hi) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kR;
  const int64_t n = std::min<int64_t>(kR, rows - r0);
  alignas(32) float out[kR];
  _mm256_store_ps(out, lo);
  _mm256_store_ps(out + 8, hi);
  float* y = a.y + token * rows + r0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = out[i] + (a.bias ? a.bias[r0 + i] : 0.0f);
  }
}

template <bool kBf16, int T>
void f32_block(const MatmulArgs& a, int64_t panel, int64_t t0) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_pairs = kp / 2;
  const std::byte* pan = a.w->panel(panel);
  const float* x = a.x + t0 * kp;
  __m256 acc_even[2][T];
  __m256 acc_odd[2][T];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc_even[h][t] = _mm256_setzero_ps();
      acc_odd[h][t] = _mm256_setzero_ps();
    }
  }
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t k2 = 0; k2 < num_pairs; ++k2) {
    __m256 w_even[2];
    __m256 w_odd[2];
    prefetch_ahead_of(pan + k2 * (kBf16 ? 64 : 128), kBf16 ? 64 : 128);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      if constexpr (kBf16) {
        __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pan + k2 * 64 + h * 32));
        w_even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        w_odd[h] = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
      } else {
        const float* src = reinterpret_cast<const float*>(pan) + k2 * 32;
        w_even[h] = _mm256_load_ps(src + h * 8);
        w_odd[h] = _mm256_load_ps(src + 16 + h * 8);
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 xe = _mm256_broadcast_ss(x + t * kp + 2 * k2);
      const __m256 xo = _mm256_broadcast_ss(x + t * kp + 2 * k2 + 1);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        acc_even[h][t] = _mm256_fmadd_ps(w_even[h], xe, acc_even[h][t]);
        acc_odd[h][t] = _mm256_fmadd_ps(w_odd[h], xo, acc_odd[h][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    store_panel_rows(a, panel, t0 + t, _mm256_add_ps(acc_even[0][t], acc_odd[0][t]),
                     _mm256_add_ps(acc_even[1][t], acc_odd[1][t]));
  }
}

template <bool kBf16>
void matmul_f32_math(const MatmulArgs& a, int64_t pb, int64_t pe) {
  for (int64_t p = pb; p < pe; ++p) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 2) {
      if (a.num_tokens - t0 >= 2) {
        f32_block<kBf16, 2>(a, p, t0);
      } else {
        f32_block<kBf16, 1>(a, p, t0);
      }
    }
  }
}

void matmul_f32(const MatmulArgs& a, int64_t pb, int64_t pe) {
  matmul_f32_math<false>(a, pb, pe);
}
void matmul_bf16(const MatmulArgs& a, int64_t pb, int64_t pe) {
  matmul_f32_math<true>(a, pb, pe);
}

// Q8_0 x Q8_0 on a 16-row panel as two 8-row halves. The stored u8 (= q + 128) go back to s8 and
// vpmaddubsw multiplies |q| (u8) with x * sign(q) (s8): |x| <= 127 (quantize_row_q8), so a pair
// sum is at most 2 * 128 * 127 and never saturates, even for a file's q = -128; the block dots
// are the exact integers of the other tables. vpmaddwd with ones folds the pairs into one int32
// per row.
template <int T>
void q8_block(const MatmulArgs& a, int64_t panel, int64_t t0) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_blocks = kp / 32;
  const std::byte* pan = a.w->panel(panel);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][T];
  for (auto& half : acc) {
    for (__m256& v : half) {
      v = _mm256_setzero_ps();
    }
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const auto* quants = reinterpret_cast<const uint8_t*>(pan + q8_quants_offset(b));
    prefetch_ahead_of(pan + b * (kQ8PairBytes / 2), kQ8PairBytes / 2);
    __m256i dots[2][T];
    for (auto& half : dots) {
      for (__m256i& v : half) {
        v = _mm256_setzero_si256();
      }
    }
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {
      __m256i q[2];
      __m256i abs_q[2];
      for (int64_t h = 0; h < 2; ++h) {
        q[h] = _mm256_xor_si256(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(quants + j * 64 + h * 32)), flip);
        abs_q[h] = _mm256_abs_epi8(q[h]);
      }
      for (int t = 0; t < T; ++t) {
        int32_t x4;
        std::memcpy(&x4, a.xq + (t0 + t) * kp + b * 32 + j * 4, 4);
        const __m256i x = _mm256_set1_epi32(x4);
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(abs_q[h], _mm256_sign_epi8(x, q[h]));
          dots[h][t] = _mm256_add_epi32(dots[h][t], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    const auto* scales = reinterpret_cast<const __m128i*>(pan + q8_scales_offset(b));
    for (int h = 0; h < 2; ++h) {
      const __m256 sw = _mm256_cvtph_ps(_mm_load_si128(scales + h));
      for (int t = 0; t < T; ++t) {
        const __m256 sx = _mm256_set1_ps(a.x_scale[(t0 + t) * num_blocks + b]);
        acc[h][t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h][t]), _mm256_mul_ps(sw, sx), acc[h][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    store_panel_rows(a, panel, t0 + t, acc[0][t], acc[1][t]);
  }
}

// A panel at a time (one stream per thread), up to 4 tokens per pass.
void matmul_q8(const MatmulArgs& a, int64_t pb, int64_t pe) {
  for (int64_t p = pb; p < pe; ++p) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 4) {
      switch (std::min<int64_t>(4, a.num_tokens - t0)) {
        case 1:
          q8_block<1>(a, p, t0);
          break;
        case 2:
          q8_block<2>(a, p, t0);
          break;
        case 3:
          q8_block<3>(a, p, t0);
          break;
        default:
          q8_block<4>(a, p, t0);
          break;
      }
    }
  }
}

// 8 values of b as f32: f32 as is, bf16 widened (a bf16 is the top half of its f32).
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// T: float, or uint16_t for bf16 (the bf16 KV cache).
template <typename T>
float dot(const float* a, const T* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i)
    s += a[i] * widen(b[i]);
  return s;
}

template <typename T>
void axpy(float s, const T* x, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, load8(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i)
    y[i] = std::fma(s, widen(x[i]), y[i]);
}

#include "kernels/row_blocks.inc"

void scale(float s, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(vs, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i)
    y[i] *= s;
}

void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float sum_sq = dot(xr, xr, dim);
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum_sq) / dim + eps));
    const __m256 vinv = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i)
      yr[i] = xr[i] * inv * weight[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i)
    y[i] += x[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i)
    out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

double peak_fma_flops(int64_t num_iters) {
  constexpr int kChains = 10;
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j)
    acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(0.999f);
  const __m256 c = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < num_iters; ++i) {
#pragma GCC unroll 10
    for (int j = 0; j < kChains; ++j)
      acc[j] = _mm256_fmadd_ps(acc[j], m, c);
  }
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j)
    s = _mm256_add_ps(s, acc[j]);
  volatile float sink = hsum(s);
  (void)sink;
  return 2.0 * 8 * kChains * static_cast<double>(num_iters);
}

}  // namespace

// quantize_row_q8 (kernel_table.h), vectorised with the same bits as in kernels_avx512.cc (see
// there: amax ignores NaN, vcvtps2dq of the rounded product, a NaN product's mantissa
// arithmetic); the quants are narrowed to their low bytes as static_cast does.
void quantize_q8(const float* x, int64_t n, int8_t* quants, float* scales, int32_t* sums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i mantissa = _mm256_set1_epi32(0x007fffff);
  const __m256i half = _mm256_set1_epi32(0x00400000);
  const __m256i low_byte = _mm256_set1_epi32(0xff);
  // The two packs interleave 4-value runs by 128-bit lane: runs 0, 4, 1, 5, ... back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * static_cast<int64_t>(i));
      m = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const Q8Scale s = q8_scale_for(_mm_cvtss_f32(m4));
    const __m256 inverse = _mm256_set1_ps(s.inverse);
    __m256i q[4];
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_mul_ps(v[i], inverse);
      const __m256i nan_q =
          _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(r), mantissa), half);
      q[i] = _mm256_blendv_epi8(_mm256_cvtps_epi32(r), nan_q,
                                _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_UNORD_Q)));
      sum = _mm256_add_epi32(sum, q[i]);
    }
    const auto low = [&](int i) { return _mm256_and_si256(q[i], low_byte); };
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(low(0), low(1)),
                                              _mm256_packus_epi32(low(2), low(3)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quants + 32 * b),
                        _mm256_permutevar8x32_epi32(bytes, order));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    scales[b] = s.stored;
    sums[b] = _mm_cvtsi128_si32(s4);
  }
}

void fill_avx2(KernelTable* t) {
  t->matmul_f32 = matmul_f32;
  t->matmul_bf16 = matmul_bf16;
  t->matmul_q8 = matmul_q8;
  t->dot = dot<float>;
  t->axpy = axpy<float>;
  t->dot_bf16 = dot<uint16_t>;
  t->axpy_bf16 = axpy<uint16_t>;
  t->dot_rows_bf16 = dot_rows<uint16_t>;
  t->axpy_rows_bf16 = axpy_rows_loop<uint16_t>;
  t->scale = scale;
  t->rms_norm = rms_norm;
  t->add_inplace = add_inplace;
  t->silu_mul = silu_mul;
  t->quantize_q8 = quantize_q8;
  t->peak_fma_flops = peak_fma_flops;
}

}  // namespace crescent::kernels::internal
