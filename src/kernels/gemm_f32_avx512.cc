// The AVX-512 prefill GEMM on f32 FMAs, for F32 weights and for BF16 weights widened in
// registers (a bf16 is the top half of its f32: one shift or AND per 16 weights, shared by the
// tile's tokens). Activations stay f32. On CPUs whose vdpbf16ps does half the FMA's work per
// cycle (Intel's Sapphire / Emerald Rapids), this is the faster BF16 GEMM as well as the more
// exact one; where vdpbf16ps runs at full rate (AMD Zen 4 / 5) kernels_avx512bf16.cc's is
// faster. bf16_gemm_uses_dot() (isa.h) chooses. Compiled with -mavx512f/bw/vl/dq; reached only
// after cpuid said so.

#include <immintrin.h>

#include <algorithm>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);
constexpr int64_t kTb = kF32GemmTokens;
// K pairs per cache block: two panels' slices (2 x 512 x 64 bytes of BF16, twice that of F32)
// and a token block's activations (8 x 1024 floats) stay in L1 / L2 across the token blocks.
constexpr int64_t kPairsPerBlock = 512;

__mmask16 row_mask(const MatmulArgs& a, int64_t panel) {
  const int64_t n = std::min<int64_t>(kR, a.w->rows() - panel * kR);
  return static_cast<__mmask16>((1u << n) - 1);
}

// y[t0..t0+T)[rows of P panels] (+)= sum over K pairs [k0, k1) of W_pair . x_pair, the pair's
// even and odd columns into one accumulator per (panel, token): P * T chains of two FMAs per pair,
// enough to cover the FMA latency for T >= 4.
template <bool kBf16, int P, int T>
void fma_block(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t k0, int64_t k1) {
  const int64_t kp = a.w->padded_cols();
  const int64_t rows = a.w->rows();
  const std::byte* pan[P];
  __mmask16 mask[P];
  __m512 acc[P][T];
#pragma GCC unroll 2
  for (int i = 0; i < P; ++i) {
    pan[i] = a.w->panel(panel0 + i);
    mask[i] = row_mask(a, panel0 + i);
    const int64_t r0 = (panel0 + i) * kR;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      if (k0 == 0) {
        acc[i][t] = a.bias ? _mm512_maskz_loadu_ps(mask[i], a.bias + r0) : _mm512_setzero_ps();
      } else {
        acc[i][t] = _mm512_maskz_loadu_ps(mask[i], a.y + (t0 + t) * rows + r0);
      }
    }
  }
  // t0 is a multiple of kTb: this block's activations are [column][kTb].
  const float* x = a.x_blocked + t0 * kp;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    __m512 w_even[P];
    __m512 w_odd[P];
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
      if constexpr (kBf16) {
        const __m512i v = _mm512_load_si512(pan[i] + k2 * 64);
        w_even[i] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        w_odd[i] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      } else {
        const auto* src = reinterpret_cast<const float*>(pan[i]) + k2 * 32;
        w_even[i] = _mm512_load_ps(src);
        w_odd[i] = _mm512_load_ps(src + 16);
      }
    }
    const float* xe = x + 2 * k2 * kTb;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 even = _mm512_set1_ps(xe[t]);
      const __m512 odd = _mm512_set1_ps(xe[kTb + t]);
#pragma GCC unroll 2
      for (int i = 0; i < P; ++i) {
        acc[i][t] = _mm512_fmadd_ps(w_even[i], even, acc[i][t]);
        acc[i][t] = _mm512_fmadd_ps(w_odd[i], odd, acc[i][t]);
      }
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, mask[i], acc[i][t]);
    }
  }
}

template <bool kBf16, int P>
void fma_tokens(const MatmulArgs& a, int64_t panel0, int64_t t0, int64_t nt, int64_t k0,
                int64_t k1) {
  static_assert(kTb == 8);
  switch (nt) {
    case 1:
      return fma_block<kBf16, P, 1>(a, panel0, t0, k0, k1);
    case 2:
      return fma_block<kBf16, P, 2>(a, panel0, t0, k0, k1);
    case 3:
      return fma_block<kBf16, P, 3>(a, panel0, t0, k0, k1);
    case 4:
      return fma_block<kBf16, P, 4>(a, panel0, t0, k0, k1);
    case 5:
      return fma_block<kBf16, P, 5>(a, panel0, t0, k0, k1);
    case 6:
      return fma_block<kBf16, P, 6>(a, panel0, t0, k0, k1);
    case 7:
      return fma_block<kBf16, P, 7>(a, panel0, t0, k0, k1);
    default:
      return fma_block<kBf16, P, 8>(a, panel0, t0, k0, k1);
  }
}

// K blocks outermost, so each element of y is summed in the same order whatever the split of
// panels between threads.
template <bool kBf16>
void gemm_fma(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t num_pairs = a.w->padded_cols() / 2;
  for (int64_t k0 = 0; k0 < num_pairs; k0 += kPairsPerBlock) {
    const int64_t k1 = std::min(num_pairs, k0 + kPairsPerBlock);
    for (int64_t p = pb; p < pe; p += 2) {
      for (int64_t t0 = 0; t0 < a.num_tokens; t0 += kTb) {
        const int64_t nt = std::min<int64_t>(kTb, a.num_tokens - t0);
        if (p + 1 < pe) {
          fma_tokens<kBf16, 2>(a, p, t0, nt, k0, k1);
        } else {
          fma_tokens<kBf16, 1>(a, p, t0, nt, k0, k1);
        }
      }
    }
  }
}

}  // namespace

void fill_gemm_f32_avx512(KernelTable* t) {
  t->gemm_f32 = gemm_fma<false>;
  t->gemm_bf16_fma = gemm_fma<true>;
}

}  // namespace crescent::kernels::internal
