// The AVX2 prefill GEMM on f32 FMAs, for F32 weights and BF16 weights widened in registers:
// gemm_f32_avx512.cc's blocking with 16 ymm registers. A 16-row panel is two 8-row halves, so a
// tile is one panel x 4 tokens (8 accumulators, 4 widened weight vectors, the broadcasts); the
// activations come in the same [8-token block][column][8] order (two tiles a block). Compiled
// with -mavx2 -mfma; reached only after cpuid said so.

#include <immintrin.h>

#include <algorithm>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);
constexpr int64_t kTb = kF32GemmTokens;
constexpr int kTileTokens = 4;
// K pairs per cache block: a panel's slice (512 x 64 bytes of BF16, twice that of F32) and a
// token block's activations (8 x 1024 floats) stay in L1 / L2 across the token blocks.
constexpr int64_t kPairsPerBlock = 512;

// The panel's rows of token t's y (bias or the previous K blocks' sums), 0 past the last row.
void load_rows(const MatmulArgs& a, int64_t panel, int64_t t, bool first, __m256* lo, __m256* hi) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kR;
  const int64_t n = std::min<int64_t>(kR, rows - r0);
  alignas(32) float v[kR] = {};
  const float* src = first ? a.bias : a.y + t * rows;
  if (src != nullptr) {
    std::copy(src + r0, src + r0 + n, v);
  }
  *lo = _mm256_load_ps(v);
  *hi = _mm256_load_ps(v + 8);
}

void store_rows(const MatmulArgs& a, int64_t panel, int64_t t, __m256 lo, __m256 hi) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kR;
  const int64_t n = std::min<int64_t>(kR, rows - r0);
  alignas(32) float v[kR];
  _mm256_store_ps(v, lo);
  _mm256_store_ps(v + 8, hi);
  std::copy(v, v + n, a.y + t * rows + r0);
}

// y[t0..t0+T)[the panel's rows] (+)= sum over K pairs [k0, k1) of W_pair . x_pair; x is the
// token block's activations from its token tb (< kTb).
template <bool kBf16, int T>
void fma_block(const MatmulArgs& a, int64_t panel, int64_t t0, int64_t tb, int64_t k0, int64_t k1) {
  const std::byte* pan = a.w->panel(panel);
  __m256 acc[2][T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    load_rows(a, panel, t0 + t, k0 == 0, &acc[0][t], &acc[1][t]);
  }
  const float* x = a.x_blocked + (t0 - tb) * a.w->padded_cols() + tb;
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    __m256 w_even[2];
    __m256 w_odd[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      if constexpr (kBf16) {
        const __m256i v =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(pan + k2 * 64 + h * 32));
        w_even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        w_odd[h] = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
      } else {
        const auto* src = reinterpret_cast<const float*>(pan) + k2 * 32;
        w_even[h] = _mm256_load_ps(src + h * 8);
        w_odd[h] = _mm256_load_ps(src + 16 + h * 8);
      }
    }
    const float* xe = x + 2 * k2 * kTb;
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 even = _mm256_broadcast_ss(xe + t);
      const __m256 odd = _mm256_broadcast_ss(xe + kTb + t);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        acc[h][t] = _mm256_fmadd_ps(w_even[h], even, acc[h][t]);
        acc[h][t] = _mm256_fmadd_ps(w_odd[h], odd, acc[h][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    store_rows(a, panel, t0 + t, acc[0][t], acc[1][t]);
  }
}

template <bool kBf16>
void fma_tokens(const MatmulArgs& a, int64_t panel, int64_t t0, int64_t tb, int64_t nt, int64_t k0,
                int64_t k1) {
  static_assert(kTileTokens == 4 && kTb % kTileTokens == 0);
  switch (nt) {
    case 1:
      return fma_block<kBf16, 1>(a, panel, t0, tb, k0, k1);
    case 2:
      return fma_block<kBf16, 2>(a, panel, t0, tb, k0, k1);
    case 3:
      return fma_block<kBf16, 3>(a, panel, t0, tb, k0, k1);
    default:
      return fma_block<kBf16, 4>(a, panel, t0, tb, k0, k1);
  }
}

// K blocks outermost, so each element of y is summed in the same order whatever the split of
// panels between threads.
template <bool kBf16>
void gemm_fma(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t num_pairs = a.w->padded_cols() / 2;
  for (int64_t k0 = 0; k0 < num_pairs; k0 += kPairsPerBlock) {
    const int64_t k1 = std::min(num_pairs, k0 + kPairsPerBlock);
    for (int64_t p = pb; p < pe; ++p) {
      for (int64_t t0 = 0; t0 < a.num_tokens; t0 += kTileTokens) {
        const int64_t nt = std::min<int64_t>(kTileTokens, a.num_tokens - t0);
        fma_tokens<kBf16>(a, p, t0, t0 % kTb, nt, k0, k1);
      }
    }
  }
}

}  // namespace

void fill_gemm_f32_avx2(KernelTable* t) {
  t->gemm_f32 = gemm_fma<false>;
  t->gemm_bf16_fma = gemm_fma<true>;
}

}  // namespace crescent::kernels::internal
