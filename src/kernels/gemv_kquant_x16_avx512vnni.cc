// AVX512-VNNI GEMV for Q4_K, Q5_K and Q6_K weights stored x16-interleaved (kquant_x16.h):
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
//   Q6_K:        y += d * dx * sum_g sc[g] * (dot_g - 32 * bsums[g])   (u = q + 32 stored)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/kernel_table.h"
#include "kernels/kquant_x16_avx512.h"

namespace crescent::kernels::internal {
namespace {

constexpr int64_t kR = kPanelRows;

inline __m512i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// Stores the T tokens' 16 outputs of panel `panel` (+ bias), masked to the weight's rows.
template <int T>
void store_outputs(const MatmulArgs& a, int64_t panel, int64_t t0, const __m512* acc) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kR;
  const int n = static_cast<int>(std::min<int64_t>(kR, rows - r0));
  const auto mask = static_cast<__mmask16>((1u << n) - 1);
  const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + r0) : _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, mask, _mm512_add_ps(acc[t], bias));
  }
}

template <typename Block, int T>
void gemv_k4_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  const int64_t num_blocks = a.w->padded_cols() / kQKBlockSize;
  const auto* g = reinterpret_cast<const uint8_t*>(a.w->panel(panel));
  const BlockQ8K* x[T];
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    x[t] = a.x_q8k + (t0 + t) * num_blocks;
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b, g += kL.group_bytes) {
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
  store_outputs<T>(a, panel, t0, acc);
}

template <int T>
void gemv_q6k_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  constexpr KQuantX16Layout kL = kQ6KX16;
  const int64_t num_blocks = a.w->padded_cols() / kQKBlockSize;
  const auto* g = reinterpret_cast<const uint8_t*>(a.w->panel(panel));
  const BlockQ8K* x[T];
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    x[t] = a.x_q8k + (t0 + t) * num_blocks;
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b, g += kL.group_bytes) {
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm512_setzero_si512();
    }
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t jh = 0; jh < 2; ++jh) {
        // Scale groups 8h + 2k + jh (k < 4): their dots start at -32 * sum(x), leaving sum(q x).
        __m512i dot[4][T];
        for (int64_t k = 0; k < 4; ++k) {
          for (int t = 0; t < T; ++t) {
            dot[k][t] = _mm512_set1_epi32(-32 * x[t][b].bsums[8 * h + 2 * k + jh]);
          }
        }
#pragma GCC unroll 4
        for (int64_t jj = 0; jj < 4; ++jj) {
          const int64_t j = 4 * jh + jj;
          __m512i u[4];
          unpack_q6k_run(g, h, j, u);
          for (int64_t k = 0; k < 4; ++k) {
            for (int t = 0; t < T; ++t) {
              const int8_t* xq = x[t][b].qs + 128 * h + 32 * k + 4 * j;
              dot[k][t] = _mm512_dpbusd_epi32(dot[k][t], u[k], broadcast4(xq));
            }
          }
        }
        for (int64_t k = 0; k < 4; ++k) {
          const __m512i sc = widen_i8x16(g + kL.scales + 16 * (8 * h + 2 * k + jh));
          for (int t = 0; t < T; ++t) {
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(dot[k][t], sc));
          }
        }
      }
    }
    const __m512 d = load_f16x16(g + kL.d);
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]),
                               _mm512_mul_ps(d, _mm512_set1_ps(x[t][b].d)), acc[t]);
    }
  }
  store_outputs<T>(a, panel, t0, acc);
}

template <typename Block, int T>
void gemv_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  if constexpr (std::is_same_v<Block, BlockQ6_K>) {
    gemv_q6k_panel<T>(a, panel, t0);
  } else {
    gemv_k4_panel<Block, T>(a, panel, t0);
  }
}

template <typename Block>
void gemv_panels(const MatmulArgs& a, int64_t pb, int64_t pe) {
  for (int64_t p = pb; p < pe; ++p) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 4) {
      switch (std::min<int64_t>(4, a.num_tokens - t0)) {
        case 1:
          gemv_panel<Block, 1>(a, p, t0);
          break;
        case 2:
          gemv_panel<Block, 2>(a, p, t0);
          break;
        case 3:
          gemv_panel<Block, 3>(a, p, t0);
          break;
        default:
          gemv_panel<Block, 4>(a, p, t0);
          break;
      }
    }
  }
}

void gemv_kquant_x16(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.w->is_x16() && a.x_q8k != nullptr);
  switch (*ggml_row_dtype(a.w->format())) {
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
