// AVX512-VNNI GEMV for the K-quant weights (Q2_K ... Q6_K) stored x16-interleaved (kquant_x16.h):
// batch-1 decode and the few-token calls below the GEMM's threshold.
//
// Per super-block of a 16-row panel: each 64-byte load of quants gives 4 values of all 16 rows,
// one vpdpbusd per token and load dots them with the broadcast activation, and the scales are
// decoded once for the 16 rows (the row dots decode them per row and per block). Per scale
// group the int32 dot is multiplied by the group's integer scale (vpmulld) and summed, exactly
// as ggml's block dot does; one convert and multiply-add per super-block scales it to floats.
//
// Arithmetic (x = dx * q8, Q8_K activations with 16-value sums bsums):
//   Q4_K / Q5_K: y += d * dx * sum_s sc[s] * dot_s - dmin * dx * sum_s m[s] * (bsums of s)
//   Q6_K / Q3_K: y += d * dx * sum_g sc[g] * (dot_g - bias * bsums[g])  (u = q + 32 / q + 4)
//   Q2_K:        y += d * dx * sum_g sc[g] * dot_g - dmin * dx * sum_g m[g] * bsums[g]

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/kernel_table.h"
#include "kernels/kquant_x16_avx512.h"
#include "kernels/x16_gemv_avx512.h"

namespace crescent::kernels::internal {
namespace {

inline __m512i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// Activation sum i of block x in the low 16 bits of every lane, for a vpdpwssd whose other
// operand holds 16-bit values (upper halves zero), which therefore reads nothing else: below the
// last sum the lane's high half carries sum i + 1, so the broadcast is a load-port one instead of
// a sign extension and a move from a general register.
inline __m512i broadcast_bsum(const BlockQ8K& x, int64_t i) {
  if (i + 1 == kQKBlockSize / 16) {
    return _mm512_set1_epi32(x.bsums[i]);  // the last: 4 bytes would read past the block
  }
  int32_t v;
  std::memcpy(&v, x.bsums + i, 4);
  return _mm512_set1_epi32(v);
}

// Tokens t0 .. t0 + T - 1: their Q8_K activation rows and zeroed output accumulators.
template <int T>
void first_tokens(const MatmulArgs& a, int64_t t0, int64_t num_blocks, const BlockQ8K** x,
                  __m512* acc) {
  for (int t = 0; t < T; ++t) {
    x[t] = a.x_q8k + (t0 + t) * num_blocks;
    acc[t] = _mm512_setzero_ps();
  }
}

template <typename Block, int T>
void gemv_k4_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  const int64_t num_blocks = a.w->padded_cols() / kQKBlockSize;
  const auto* g = reinterpret_cast<const uint8_t*>(a.w->panel(panel));
  const BlockQ8K* x[T];
  __m512 acc[T];
  first_tokens<T>(a, t0, num_blocks, x, acc);
  for (int64_t b = 0; b < num_blocks; ++b, g += kL.group_bytes) {
    prefetch_ahead_of(g, kL.group_bytes);
    K4ScalesX16 s;
    decode_k4_scales_x16(g + kL.scales, &s);
    __m512i sumi[T];
    __m512i summ[T];
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm512_setzero_si512();
      summ[t] = _mm512_setzero_si512();
    }
    for (int64_t c = 0; c < 4; ++c) {
      __m512i lo[T];
      __m512i hi[T];
      for (int t = 0; t < T; ++t) {
        lo[t] = _mm512_setzero_si512();
        hi[t] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int64_t j = 0; j < 8; ++j) {
        __m512i u_lo;
        __m512i u_hi;
        unpack_k4_run<Block>(g, c, j, &u_lo, &u_hi);
        for (int t = 0; t < T; ++t) {
          const int8_t* xq = x[t][b].qs + 64 * c + 4 * j;
          lo[t] = _mm512_dpbusd_epi32(lo[t], u_lo, broadcast4(xq));
          hi[t] = _mm512_dpbusd_epi32(hi[t], u_hi, broadcast4(xq + 32));
        }
      }
      const __m512i sc_lo = widen_u8x16(s.scale + 16 * (2 * c));
      const __m512i sc_hi = widen_u8x16(s.scale + 16 * (2 * c + 1));
      for (int t = 0; t < T; ++t) {
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(lo[t], sc_lo));
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(hi[t], sc_hi));
      }
    }
    // The mins against each sub-block's activation sum (two 16-value bsums, |sum| < 2^15):
    // int32 lanes holding 16-bit values, so one vpdpwssd multiplies and adds them.
    for (int64_t i = 0; i < 8; ++i) {
      const __m512i m = widen_u8x16(s.min + 16 * i);
      for (int t = 0; t < T; ++t) {
        const int32_t xs = x[t][b].bsums[2 * i] + x[t][b].bsums[2 * i + 1];
        summ[t] = _mm512_dpwssd_epi32(summ[t], m, _mm512_set1_epi32(xs));
      }
    }
    const __m512 d = load_f16x16(g + kL.d);
    const __m512 dmin = load_f16x16(g + kL.dmin);
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(x[t][b].d);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(d, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ[t]), _mm512_mul_ps(dmin, dx), acc[t]);
    }
  }
  store_x16_outputs<T>(a, panel, t0, acc);
}

// Q2_K, Q3_K and Q6_K: 16 scale groups of 16 values.
template <typename Block, int T>
void gemv_g16_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  constexpr int32_t kBias = g16_bias<Block>();
  constexpr bool kHasMin = std::is_same_v<Block, BlockQ2_K>;
  // Q2_K's mins: for up to two tokens in the scale loop, from the same widening of each group's
  // scale byte (one token on cache-resident weights: 13% faster than the loop after it; two:
  // 30%); for three and four the loop after it was as fast or faster.
  constexpr bool kFusedMins = kHasMin && T <= 2;
  // Q2_K / Q3_K leave their quants in place (unpack_g16_run_in_place); Q6_K's dots do not fit
  // in 16 bits, so they are multiplied by the scales in 32 (vpmulld).
  constexpr bool kInPlace = !std::is_same_v<Block, BlockQ6_K>;
  const int64_t num_blocks = a.w->padded_cols() / kQKBlockSize;
  const auto* g = reinterpret_cast<const uint8_t*>(a.w->panel(panel));
  const BlockQ8K* x[T];
  __m512 acc[T];
  first_tokens<T>(a, t0, num_blocks, x, acc);
  for (int64_t b = 0; b < num_blocks; ++b, g += kL.group_bytes) {
    prefetch_ahead_of(g, kL.group_bytes);
    const G16ScalesX16<Block> s(g);
    __m512i sumi[T];
    __m512i summ[T];  // Q2_K: sum_g m[g] * bsums[g]
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm512_setzero_si512();
      summ[t] = _mm512_setzero_si512();
    }
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t jh = 0; jh < 2; ++jh) {
        // Scale groups 8h + 2k + jh (k < 4): their dots start at -bias * sum(x), leaving
        // sum(q x).
        __m512i dot[4][T];
        for (int64_t k = 0; k < 4; ++k) {
          for (int t = 0; t < T; ++t) {
            const int32_t scale = kInPlace ? 1 << (2 * g16_in_place_shift<Block>(k)) : 1;
            dot[k][t] = _mm512_set1_epi32(-kBias * scale * x[t][b].bsums[8 * h + 2 * k + jh]);
          }
        }
#pragma GCC unroll 4
        for (int64_t jj = 0; jj < 4; ++jj) {
          const int64_t j = 4 * jh + jj;
          __m512i u[4];
          if constexpr (kInPlace) {
            unpack_g16_run_in_place<Block>(g, h, j, u);
          } else {
            unpack_g16_run<Block>(g, h, j, u);
          }
          for (int64_t k = 0; k < 4; ++k) {
            for (int t = 0; t < T; ++t) {
              const int8_t* xq = x[t][b].qs + 128 * h + 32 * k + 4 * j;
              dot[k][t] = _mm512_dpbusd_epi32(dot[k][t], u[k], broadcast4(xq));
            }
          }
        }
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t group = 8 * h + 2 * k + jh;
          if constexpr (kInPlace) {
            // sum(q x) of a group of 16 fits in 16 bits (Q3_K: |q| <= 4; Q2_K: u <= 3), so
            // one vpdpwssd multiplies it by the scale and adds.
            __m512i sc;
            __m512i m = _mm512_setzero_si512();
            if constexpr (kFusedMins) {
              s.scale_and_min(group, &sc, &m);
            } else {
              sc = s.scale_low16(group);
            }
            const int shift = 2 * g16_in_place_shift<Block>(k);
            for (int t = 0; t < T; ++t) {
              const __m512i v = shift == 0 ? dot[k][t] : _mm512_srai_epi32(dot[k][t], shift);
              sumi[t] = _mm512_dpwssd_epi32(sumi[t], v, sc);
              if constexpr (kFusedMins) {
                // The group's min against its 16 activations' sum (|sum| < 2^11).
                summ[t] = _mm512_dpwssd_epi32(summ[t], m, broadcast_bsum(x[t][b], group));
              }
            }
          } else {
            const __m512i sc = s.scale(group);
            for (int t = 0; t < T; ++t) {
              sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(dot[k][t], sc));
            }
          }
        }
      }
    }
    const __m512 d = load_f16x16(g + kL.d);
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]),
                               _mm512_mul_ps(d, _mm512_set1_ps(x[t][b].d)), acc[t]);
    }
    if constexpr (kHasMin && !kFusedMins) {
      // As in the fused form: each group's min against its activations' sum.
      for (int64_t i = 0; i < 16; ++i) {
        const __m512i m = s.min(i);
        for (int t = 0; t < T; ++t) {
          summ[t] = _mm512_dpwssd_epi32(summ[t], m, broadcast_bsum(x[t][b], i));
        }
      }
    }
    if constexpr (kHasMin) {
      const __m512 dmin = load_f16x16(g + kL.dmin);
      for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ[t]),
                                  _mm512_mul_ps(dmin, _mm512_set1_ps(x[t][b].d)), acc[t]);
      }
    }
  }
  store_x16_outputs<T>(a, panel, t0, acc);
}

template <typename Block, int T>
void gemv_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  if constexpr (std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K>) {
    gemv_k4_panel<Block, T>(a, panel, t0);
  } else {
    gemv_g16_panel<Block, T>(a, panel, t0);
  }
}

template <typename Block>
void gemv_panels(const MatmulArgs& a, int64_t pb, int64_t pe) {
  for_each_x16_pass(a, pb, pe, [&](auto tokens, int64_t p, int64_t t0) {
    gemv_panel<Block, decltype(tokens)::value>(a, p, t0);
  });
}

void gemv_kquant_x16(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.w->is_x16() && a.x_q8k != nullptr);
  switch (*ggml_row_dtype(a.w->format())) {
    case DType::kQ2_K:
      return gemv_panels<BlockQ2_K>(a, pb, pe);
    case DType::kQ3_K:
      return gemv_panels<BlockQ3_K>(a, pb, pe);
    case DType::kQ4_K:
      return gemv_panels<BlockQ4_K>(a, pb, pe);
    case DType::kQ5_K:
      return gemv_panels<BlockQ5_K>(a, pb, pe);
    case DType::kQ6_K:
      return gemv_panels<BlockQ6_K>(a, pb, pe);
    default:
      CRESCENT_CHECK(false) << "no x16 K-quant GEMV for " << weight_format_name(a.w->format());
  }
}

}  // namespace

void fill_gemv_kquant_x16_avx512vnni(KernelTable* t) {
  t->gemv_kquant_x16 = gemv_kquant_x16;
}

}  // namespace crescent::kernels::internal
