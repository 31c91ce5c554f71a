// AVX-512 (F/BW/VL/DQ) implementations: f32 math on F32 and BF16 weights (BF16 widened in
// registers), vector ops for norms, activations and attention. Compiled with -mavx512*; only
// reached through the kernel table after cpuid said the CPU has these instructions.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "kernels/avx512_math.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);

__mmask16 row_mask(const MatmulArgs& a, int64_t panel) {
  int64_t n = std::min<int64_t>(kR, a.w->rows() - panel * kR);
  return static_cast<__mmask16>((1u << n) - 1);
}

// P panels x T tokens of f32 math over the whole K; even and odd columns of each K pair
// accumulate separately (2*P*T independent chains).
template <bool kBf16, int P, int T>
void f32_block(const MatmulArgs& a, int64_t panel0, int64_t t0) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_pairs = kp / 2;
  const std::byte* pan[P];
  for (int i = 0; i < P; ++i)
    pan[i] = a.w->panel(panel0 + i);
  const float* x = a.x + t0 * kp;
  __m512 acc_even[P][T];
  __m512 acc_odd[P][T];
#pragma GCC unroll 8
  for (int i = 0; i < P; ++i) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      acc_even[i][t] = _mm512_setzero_ps();
      acc_odd[i][t] = _mm512_setzero_ps();
    }
  }
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t k2 = 0; k2 < num_pairs; ++k2) {
    __m512 w_even[P];
    __m512 w_odd[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) {
      if constexpr (kBf16) {
        const std::byte* src = pan[i] + k2 * 64;
        _mm_prefetch(reinterpret_cast<const char*>(src) + 1024, _MM_HINT_T0);
        __m512i v = _mm512_load_si512(src);
        w_even[i] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        w_odd[i] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      } else {
        const float* src = reinterpret_cast<const float*>(pan[i]) + k2 * 32;
        _mm_prefetch(reinterpret_cast<const char*>(src) + 2048, _MM_HINT_T0);
        w_even[i] = _mm512_load_ps(src);
        w_odd[i] = _mm512_load_ps(src + 16);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 xe = _mm512_set1_ps(x[t * kp + 2 * k2]);
      const __m512 xo = _mm512_set1_ps(x[t * kp + 2 * k2 + 1]);
#pragma GCC unroll 8
      for (int i = 0; i < P; ++i) {
        acc_even[i][t] = _mm512_fmadd_ps(w_even[i], xe, acc_even[i][t]);
        acc_odd[i][t] = _mm512_fmadd_ps(w_odd[i], xo, acc_odd[i][t]);
      }
    }
  }
  const int64_t rows = a.w->rows();
#pragma GCC unroll 8
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
    const __mmask16 m = row_mask(a, panel0 + i);
    __m512 b = a.bias ? _mm512_maskz_loadu_ps(m, a.bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512 v = _mm512_add_ps(acc_even[i][t], acc_odd[i][t]);
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, m, _mm512_add_ps(v, b));
    }
  }
}

template <bool kBf16, int P>
void f32_tokens(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t num_tokens) {
  switch (num_tokens) {
    case 1:
      return f32_block<kBf16, P, 1>(a, panel0, t0);
    case 2:
      return f32_block<kBf16, P, 2>(a, panel0, t0);
    case 3:
      return f32_block<kBf16, P, 3>(a, panel0, t0);
    default:
      return f32_block<kBf16, P, 4>(a, panel0, t0);
  }
}

// One pass over the tokens (decode): a panel at a time, so each thread reads one sequential stream
// (BF16 batch 1, one thread: 1.15x the GB/s of two panels' streams). More tokens: two panels
// share each activation broadcast.
template <bool kBf16>
void matmul_f32_math(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t step = a.num_tokens <= 4 ? 1 : 2;
  for (int64_t p = pb; p < pe; p += step) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 4) {
      const int64_t nt = std::min<int64_t>(4, a.num_tokens - t0);
      if (step == 2 && p + 1 < pe) {
        f32_tokens<kBf16, 2>(a, p, t0, nt);
      } else {
        f32_tokens<kBf16, 1>(a, p, t0, nt);
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

// Q8_0 x Q8_0 without VNNI: the u8 (= q + 128) weights widen to i16 and vpmaddwd multiplies
// them with the i16 activations, giving (row, column pair) sums for 8 rows per vector; the pairs
// are folded once per block and the +128 removed with the activation quant sum, as in the VNNI
// kernel, so the block dots are the same exact integers.
template <int P, int T>
void q8_block(const MatmulArgs& a, int64_t panel0, int64_t t0) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_blocks = kp / 32;
  const int64_t rows = a.w->rows();
  const std::byte* panels[P];
  __m512 acc[P][T];
  const __m512i even_idx =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_add_epi32(even_idx, _mm512_set1_epi32(1));
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    panels[i] = a.w->panel(panel0 + i);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
      acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* scales[P];
    const uint8_t* quants[P];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      scales[i] = panels[i] + q8_scales_offset(b);
      quants[i] = reinterpret_cast<const uint8_t*>(panels[i] + q8_quants_offset(b));
      prefetch_ahead_of(panels[i] + b * (kQ8PairBytes / 2), kQ8PairBytes / 2);
    }
    __m512i lo[P][T];
    __m512i hi[P][T];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        lo[i][t] = _mm512_setzero_si512();
        hi[i][t] = _mm512_setzero_si512();
      }
    }
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {
      __m512i w_lo[P];
      __m512i w_hi[P];
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) {
        const uint8_t* src = quants[i] + j * 64;
        w_lo[i] = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(src)));
        w_hi[i] =
            _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32)));
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.xq + (t0 + t) * kp + b * 32 + j * 4;
        const __m512i xb = _mm512_set1_epi64(
            static_cast<int64_t>(static_cast<uint16_t>(xq[0]) |
                                 (static_cast<uint64_t>(static_cast<uint16_t>(xq[1])) << 16) |
                                 (static_cast<uint64_t>(static_cast<uint16_t>(xq[2])) << 32) |
                                 (static_cast<uint64_t>(static_cast<uint16_t>(xq[3])) << 48)));
#pragma GCC unroll 4
        for (int i = 0; i < P; ++i) {
          lo[i][t] = _mm512_add_epi32(lo[i][t], _mm512_madd_epi16(w_lo[i], xb));
          hi[i][t] = _mm512_add_epi32(hi[i][t], _mm512_madd_epi16(w_hi[i], xb));
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      const __m512 sw =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales[i])));
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int64_t xi = (t0 + t) * num_blocks + b;
        const __m512i dot =
            _mm512_add_epi32(_mm512_permutex2var_epi32(lo[i][t], even_idx, hi[i][t]),
                             _mm512_permutex2var_epi32(lo[i][t], odd_idx, hi[i][t]));
        const __m512i corr = _mm512_set1_epi32(128 * a.x_sum[xi]);
        const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, corr));
        acc[i][t] = _mm512_fmadd_ps(d, _mm512_mul_ps(sw, _mm512_set1_ps(a.x_scale[xi])), acc[i][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
    const __mmask16 m = row_mask(a, panel0 + i);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(m, a.bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, m, _mm512_add_ps(acc[i][t], bias));
    }
  }
}

// As matmul_f32_math: one panel (one stream) per thread in a single pass over the tokens.
void matmul_q8(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t panels_per_step = a.num_tokens <= 2 ? 1 : 2;
  for (int64_t p = pb; p < pe; p += panels_per_step) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 2) {
      const bool two_panels = panels_per_step == 2 && p + 1 < pe;
      const bool two_tokens = a.num_tokens - t0 >= 2;
      if (two_panels && two_tokens) {
        q8_block<2, 2>(a, p, t0);
      } else if (two_panels) {
        q8_block<2, 1>(a, p, t0);
      } else if (two_tokens) {
        q8_block<1, 2>(a, p, t0);
      } else {
        q8_block<1, 1>(a, p, t0);
      }
    }
  }
}

// exp(x) in the lanes of `live`, 0 elsewhere and wherever x is below exp_ps's clamp (a masked
// -inf score gives 0, not 1.2e-38).
inline __m512 masked_exp(__m512 x, __mmask16 live) {
  const __mmask16 above = _mm512_mask_cmp_ps_mask(live, x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(above, exp_ps(x));
}

inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1);
}

// The m-masked values of p as f32: f32 as is, bf16 widened (a bf16 is the top half of its f32).
inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load16(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// T: float, or uint16_t for bf16 (the bf16 KV cache).
template <typename T>
float dot(const float* a, const T* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i, 0xffff), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load16(b + i + 16, 0xffff), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load16(b + i, m), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

template <typename T>
void axpy(float s, const T* x, float* y, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    __m512 v = _mm512_fmadd_ps(vs, load16(x + i, m), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

#include "kernels/row_blocks.inc"

// ggml's quantize_row_q8_K_ref, vectorised with the same bits: the value of largest magnitude
// (the first one, as the reference's strict > keeps), q = min(127, round-half-even(x * iscale))
// (vcvtps2dq under the default rounding = nearest_int for |v| <= 127), sums of each 16.
void quantize_q8_k(const float* x, int64_t num_values, BlockQ8K* y) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < num_values / kQKBlockSize; ++i, x += kQKBlockSize) {
    __m512 vmax = _mm512_setzero_ps();
    for (int j = 0; j < kQKBlockSize; j += 16)
      vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask));
    const float amax = _mm512_reduce_max_ps(vmax);
    if (amax == 0) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    float max = 0;
    for (int j = 0; j < kQKBlockSize; j += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask),
                                               _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit != 0) {
        max = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int j = 0; j < kQKBlockSize; j += 16) {
      const __m512i q = _mm512_min_epi32(
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), vs)), _mm512_set1_epi32(127));
      // The sums are of the stored bytes (a block below ~4e-37 has an infinite iscale).
      const __m128i q8 = _mm512_cvtepi32_epi8(q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + j), q8);
      y[i].bsums[j / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q8)));
    }
    y[i].d = 1 / iscale;
  }
}

// quantize_row_q8 (kernel_table.h), vectorised with the same bits: amax ignores NaN as the
// reference's std::max(amax, |x|) does (vmaxps returns its second operand when one is NaN). The
// quants are vcvtps2dq of the rounded product, which equals the reference's float-mantissa
// rounding for |v| <= 127; a NaN product (a NaN input, or inf * 0) takes the reference's mantissa
// arithmetic. Not the magic-number add itself: GCC contracts an intrinsic multiply and add into
// an FMA, which rounds once and differs from the reference near ties.
void quantize_q8(const float* x, int64_t n, int8_t* quants, float* scales, int32_t* sums) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i mantissa = _mm512_set1_epi32(0x007fffff);
  const __m512i half = _mm512_set1_epi32(0x00400000);
  const auto quantise = [&](__m512 x16, __m512 inverse) {
    const __m512 v = _mm512_mul_ps(x16, inverse);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_sub_epi32(_mm512_cvtps_epi32(v), nan,
                                 _mm512_and_si512(_mm512_castps_si512(v), mantissa), half);
  };
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    const __m512 x0 = _mm512_loadu_ps(x);
    const __m512 x1 = _mm512_loadu_ps(x + 16);
    const __m512 m0 = _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_setzero_ps());
    const __m512 m = _mm512_max_ps(_mm512_and_ps(x1, abs_mask), m0);
    const Q8Scale s = q8_scale_for(_mm512_reduce_max_ps(m));
    const __m512 inverse = _mm512_set1_ps(s.inverse);
    const __m512i q0 = quantise(x0, inverse);
    const __m512i q1 = quantise(x1, inverse);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(quants + 32 * b), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(quants + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    scales[b] = s.stored;
    sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}

// y's 64-value runs stay in registers across the block's rows.
template <typename T>
void axpy_rows(const float* p, const T* rows, int64_t stride, int n, int64_t dim, float* y) {
  for (int64_t i = 0; i < dim; i += 64) {
    __mmask16 m[4];
    __m512 acc[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t left = dim - i - 16 * c;
      m[c] = tail_mask(std::clamp<int64_t>(left, 0, 16));
      acc[c] = _mm512_maskz_loadu_ps(m[c], y + i + 16 * c);
    }
    for (int j = 0; j < n; ++j) {
      const __m512 vp = _mm512_set1_ps(p[j]);
      const T* row = rows + j * stride + i;
      for (int c = 0; c < 4; ++c)
        acc[c] = _mm512_fmadd_ps(vp, load16(row + 16 * c, m[c]), acc[c]);
    }
    for (int c = 0; c < 4; ++c)
      _mm512_mask_storeu_ps(y + i + 16 * c, m[c], acc[c]);
  }
}

void scale(float s, float* y, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float sum_sq = dot(xr, xr, dim);
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum_sq) / dim + eps));
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < dim; i += 16) {
      const __mmask16 m = tail_mask(std::min<int64_t>(16, dim - i));
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), vinv);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
    }
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

float exp_sum(float* x, int64_t n, float scale, float shift) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 vshift = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    const __m512 v = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, x + i), vscale, vshift);
    const __m512 e = masked_exp(v, m);
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

float max_value(const float* x, int64_t n) {
  // MAX_PS(v, m) is m when v is NaN: a NaN never becomes the maximum.
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(std::min<int64_t>(16, n - i));
    const __m512 v = _mm512_mask_loadu_ps(m, k, x + i);
    m = _mm512_max_ps(v, m);
  }
  return _mm512_reduce_max_ps(m);
}

double peak_fma_flops(int64_t num_iters) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j)
    acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(0.999f);
  const __m512 c = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < num_iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j)
      acc[j] = _mm512_fmadd_ps(acc[j], m, c);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j)
    s = _mm512_add_ps(s, acc[j]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return 2.0 * 16 * kChains * static_cast<double>(num_iters);
}

}  // namespace

void fill_avx512(KernelTable* t) {
  t->matmul_f32 = matmul_f32;
  t->matmul_bf16 = matmul_bf16;
  t->matmul_q8 = matmul_q8;
  t->dot = dot<float>;
  t->axpy = axpy<float>;
  t->dot_bf16 = dot<uint16_t>;
  t->axpy_bf16 = axpy<uint16_t>;
  t->dot_rows_bf16 = dot_rows<uint16_t>;
  t->axpy_rows_bf16 = axpy_rows<uint16_t>;
  t->quantize_q8_k = quantize_q8_k;
  t->quantize_q8 = quantize_q8;
  t->scale = scale;
  t->rms_norm = rms_norm;
  t->add_inplace = add_inplace;
  t->silu_mul = silu_mul;
  t->exp_sum = exp_sum;
  t->max_value = max_value;
  t->peak_fma_flops = peak_fma_flops;
}

}  // namespace crescent::kernels::internal
