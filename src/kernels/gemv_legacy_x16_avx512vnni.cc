// AVX512-VNNI GEMV for the legacy ggml block types stored x16-interleaved (legacy_x16.h): batch-1
// decode and the few-token calls below the GEMM's threshold.
//
// Per block of a 16-row panel: four zmm loads give the quants of all 16 rows, eight vpdpbusd per
// token (one per column run, the activation's four bytes broadcast) give the 16 rows' int32 block
// dots, and one convert and two multiply-adds scale them. A row dot over the file's layout spends
// that scale work, and the unpacking, on every block of every row.
//
// Arithmetic: the dot starts from -kBias * sum(x) so it is sum((u - kBias) * x) = sum(q * x),
// exact in int32, as ggml's block dot; then y += (float)dot * (d * dx). Q4_1 / Q5_1 add
// m * dx * sum(x) per block.

#include <immintrin.h>

#include <algorithm>

#include "kernels/kernel_table.h"
#include "kernels/legacy_x16_avx512.h"
#include "kernels/x16_gemv_avx512.h"

namespace crescent::kernels::internal {
namespace {

template <typename Block, int T>
void gemv_panel(const MatmulArgs& a, int64_t panel, int64_t t0) {
  using L = LegacyX16<Block>;
  const int64_t kp = a.w->padded_cols();
  const int64_t num_blocks = kp / 32;
  const auto* p = reinterpret_cast<const uint8_t*>(a.w->panel(panel));
  const __m512i levels = L::kNonLinear ? iq4nl_unsigned_levels() : _mm512_setzero_si512();
  const int8_t* xq[T];
  const float* dx[T];
  const int32_t* xs[T];
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    xq[t] = a.xq + (t0 + t) * kp;
    dx[t] = a.x_scale + (t0 + t) * num_blocks;
    xs[t] = a.x_sum + (t0 + t) * num_blocks;
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b, p += L::kGroupBytes) {
    prefetch_ahead_of(p, L::kGroupBytes);
    __m512i u[8];
    unpack_x16_group<Block>(p, levels, u);
    const __m512 d = load_x16_f16s(p + L::kDOffset);
    const __m512 m = L::kHasMin ? load_x16_f16s(p + L::kMOffset) : _mm512_setzero_ps();
    for (int t = 0; t < T; ++t) {
      const int8_t* x = xq[t] + 32 * b;
      const auto x4 = [&](int64_t j) {
        int32_t v;
        std::memcpy(&v, x + 4 * j, 4);
        return _mm512_set1_epi32(v);
      };
      // Two chains, so the eight dependent vpdpbusd do not serialise on their latency.
      __m512i even = _mm512_set1_epi32(-L::kBias * xs[t][b]);
      __m512i odd = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        even = _mm512_dpbusd_epi32(even, u[j], x4(j));
        odd = _mm512_dpbusd_epi32(odd, u[j + 1], x4(j + 1));
      }
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
      const __m512 dxv = _mm512_set1_ps(dx[t][b]);
      acc[t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, dxv), acc[t]);
      if constexpr (L::kHasMin) {
        acc[t] =
            _mm512_fmadd_ps(m, _mm512_set1_ps(dx[t][b] * static_cast<float>(xs[t][b])), acc[t]);
      }
    }
  }
  store_x16_outputs<T>(a, panel, t0, acc);
}

template <typename Block>
void gemv_panels(const MatmulArgs& a, int64_t pb, int64_t pe) {
  for_each_x16_pass(a, pb, pe, [&](auto tokens, int64_t p, int64_t t0) {
    gemv_panel<Block, decltype(tokens)::value>(a, p, t0);
  });
}

void gemv_legacy_x16(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.w->is_x16());
  switch (*ggml_row_dtype(a.w->format())) {
    case DType::kQ4_0:
      return gemv_panels<BlockQ4_0>(a, pb, pe);
    case DType::kQ4_1:
      return gemv_panels<BlockQ4_1>(a, pb, pe);
    case DType::kQ5_0:
      return gemv_panels<BlockQ5_0>(a, pb, pe);
    case DType::kQ5_1:
      return gemv_panels<BlockQ5_1>(a, pb, pe);
    case DType::kIQ4_NL:
      return gemv_panels<BlockIQ4_NL>(a, pb, pe);
    default:
      CRESCENT_CHECK(false) << "no x16 GEMV for " << weight_format_name(a.w->format());
  }
}

}  // namespace

void fill_gemv_legacy_x16_avx512vnni(KernelTable* t) {
  t->gemv_legacy_x16 = gemv_legacy_x16;
}

}  // namespace crescent::kernels::internal
