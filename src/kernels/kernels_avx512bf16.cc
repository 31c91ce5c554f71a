// AVX512-BF16 + AVX512-VNNI implementations: the prefill GEMM on vdpbf16ps (activations rounded
// to BF16 once per call, F32 accumulation) and the Q8_0 kernel on vpdpbusd (exact int32 block
// dots). Compiled with -mavx512bf16 -mavx512vnni; reached only after cpuid said so.

#include <immintrin.h>

#include <algorithm>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);
constexpr int64_t kGemmTokens = kBf16GemmTokens;
// K pairs per cache block: a 32-row W slice of 1024 pairs is 128 KiB, well inside L2.
constexpr int64_t kGemmPairsPerBlock = 1024;

__mmask16 row_mask(const MatmulArgs& a, int64_t panel) {
  int64_t n = std::min<int64_t>(kR, a.w->rows() - panel * kR);
  return static_cast<__mmask16>((1u << n) - 1);
}

// y[t0..t0+T)[rows of P panels] (+)= sum over K pairs [k0, k1) of W_pair . x_pair.
template <int P, int T>
void dot_block(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t k0, int64_t k1) {
  const int64_t num_pairs = a.w->padded_cols() / 2;
  const int64_t rows = a.w->rows();
  const uint16_t* pan[P];
  __mmask16 mask[P];
  __m512 acc[P][T];
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    pan[i] = reinterpret_cast<const uint16_t*>(a.w->panel(panel0 + i));
    mask[i] = row_mask(a, panel0 + i);
    const int64_t r0 = (panel0 + i) * kR;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      if (k0 == 0) {
        acc[i][t] = a.bias ? _mm512_maskz_loadu_ps(mask[i], a.bias + r0) : _mm512_setzero_ps();
      } else {
        acc[i][t] = _mm512_maskz_loadu_ps(mask[i], a.y + (t0 + t) * rows + r0);
      }
    }
  }
  // t0 is a multiple of kGemmTokens: this block's activations are [pair][kGemmTokens].
  const uint32_t* x = a.x_bf16 + t0 * num_pairs;
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    __m512bh w[P];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      w[i] = reinterpret_cast<__m512bh>(_mm512_load_si512(pan[i] + k2 * 32));
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512bh xb =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[k2 * kGemmTokens + t])));
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i)
        acc[i][t] = _mm512_dpbf16_ps(acc[i][t], w[i], xb);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, mask[i], acc[i][t]);
  }
}

template <int P>
void dot_tokens(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t nt, int64_t k0,
                int64_t k1) {
  switch (nt) {
    case 1:
      return dot_block<P, 1>(a, panel0, t0, k0, k1);
    case 2:
      return dot_block<P, 2>(a, panel0, t0, k0, k1);
    case 3:
      return dot_block<P, 3>(a, panel0, t0, k0, k1);
    case 4:
      return dot_block<P, 4>(a, panel0, t0, k0, k1);
    case 5:
      return dot_block<P, 5>(a, panel0, t0, k0, k1);
    case 6:
      return dot_block<P, 6>(a, panel0, t0, k0, k1);
    case 7:
      return dot_block<P, 7>(a, panel0, t0, k0, k1);
    case 8:
      return dot_block<P, 8>(a, panel0, t0, k0, k1);
    case 9:
      return dot_block<P, 9>(a, panel0, t0, k0, k1);
    case 10:
      return dot_block<P, 10>(a, panel0, t0, k0, k1);
    case 11:
      return dot_block<P, 11>(a, panel0, t0, k0, k1);
    default:
      return dot_block<P, 12>(a, panel0, t0, k0, k1);
  }
}

void gemm_bf16_dot(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t num_pairs = a.w->padded_cols() / 2;
  for (int64_t k0 = 0; k0 < num_pairs; k0 += kGemmPairsPerBlock) {
    const int64_t k1 = std::min(num_pairs, k0 + kGemmPairsPerBlock);
    for (int64_t p = pb; p < pe; p += 2) {
      for (int64_t t0 = 0; t0 < a.num_tokens; t0 += kGemmTokens) {
        const int64_t nt = std::min<int64_t>(kGemmTokens, a.num_tokens - t0);
        if (p + 1 < pe) {
          dot_tokens<2>(a, p, t0, nt, k0, k1);
        } else {
          dot_tokens<1>(a, p, t0, nt, k0, k1);
        }
      }
    }
  }
}

// Q8_0 x Q8_0: weights are stored as u8 = q + 128 so vpdpbusd (u8 x s8) applies directly; the
// +128 is removed per block with the activation quant sum (exact integer arithmetic).
template <int P, int T>
void q8_block(const MatmulArgs& a, int64_t panel0, int64_t t0) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_blocks = kp / 32;
  const int64_t rows = a.w->rows();
  const std::byte* panels[P];
  __m512 acc[P][T];
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    panels[i] = a.w->panel(panel0 + i);
#pragma GCC unroll 8
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
    __m512i dots[P][T];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        dots[i][t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {
      __m512i w[P];
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i)
        w[i] = _mm512_load_si512(quants[i] + j * 64);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        int32_t x4;
        __builtin_memcpy(&x4, a.xq + (t0 + t) * kp + b * 32 + j * 4, 4);
        const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
        for (int i = 0; i < P; ++i)
          dots[i][t] = _mm512_dpbusd_epi32(dots[i][t], w[i], xb);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      const __m512 sw =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales[i])));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int64_t xi = (t0 + t) * num_blocks + b;
        const __m512i corr = _mm512_set1_epi32(128 * a.x_sum[xi]);
        const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(dots[i][t], corr));
        acc[i][t] = _mm512_fmadd_ps(d, _mm512_mul_ps(sw, _mm512_set1_ps(a.x_scale[xi])), acc[i][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
    const __mmask16 m = row_mask(a, panel0 + i);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(m, a.bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, m, _mm512_add_ps(acc[i][t], bias));
    }
  }
}

template <int P>
void q8_tokens(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t nt) {
  switch (nt) {
    case 1:
      return q8_block<P, 1>(a, panel0, t0);
    case 2:
      return q8_block<P, 2>(a, panel0, t0);
    case 3:
      return q8_block<P, 3>(a, panel0, t0);
    default:
      return q8_block<P, 4>(a, panel0, t0);
  }
}

// One pass over the tokens (decode): a panel at a time, so a thread reads one sequential stream
// (1.3x the GB/s of two panels' streams at batch 1). More tokens: two panels share each
// activation broadcast.
void matmul_q8(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t panels_per_step = a.num_tokens <= 4 ? 1 : 2;
  for (int64_t p = pb; p < pe; p += panels_per_step) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 4) {
      const int64_t nt = std::min<int64_t>(4, a.num_tokens - t0);
      if (panels_per_step == 2 && p + 1 < pe) {
        q8_tokens<2>(a, p, t0, nt);
      } else {
        q8_tokens<1>(a, p, t0, nt);
      }
    }
  }
}

double peak_bf16_flops(int64_t num_iters) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j)
    acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512bh m = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1.0, 1.0)
  const __m512bh c = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3a803a80));  // tiny
  for (int64_t i = 0; i < num_iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j)
      acc[j] = _mm512_dpbf16_ps(acc[j], m, c);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j)
    s = _mm512_add_ps(s, acc[j]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  // 16 lanes x 2 products, 2 flops per multiply-add.
  return 2.0 * 32 * kChains * static_cast<double>(num_iters);
}

}  // namespace

void fill_avx512bf16(KernelTable* t) {
  t->gemm_bf16_dot = gemm_bf16_dot;
  t->matmul_q8 = matmul_q8;
  t->peak_bf16_flops = peak_bf16_flops;
}

}  // namespace crescent::kernels::internal
