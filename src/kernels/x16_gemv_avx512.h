#pragma once
// Internal to the AVX512-VNNI x16 GEMVs (gemv_legacy_x16_avx512vnni.cc and
// gemv_kquant_x16_avx512vnni.cc): what both do around their per-panel kernels, which keep up to
// four tokens' 16 outputs in registers.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {

// Stores tokens t0 .. t0 + T - 1's outputs of panel `panel` (+ bias), masked to the weight's
// rows.
template <int T>
inline void store_x16_outputs(const MatmulArgs& a, int64_t panel, int64_t t0, const __m512* acc) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kPanelRows;
  const int n = static_cast<int>(std::min<int64_t>(kPanelRows, rows - r0));
  const auto mask = static_cast<__mmask16>((1u << n) - 1);
  const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + r0) : _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, mask, _mm512_add_ps(acc[t], bias));
  }
}

// Calls panel_fn(std::integral_constant<int, T>{}, panel, t0) for panels [pb, pe) and the
// tokens in passes of up to four from t0 (T, the pass's token count, a compile-time constant).
template <typename PanelFn>
inline void for_each_x16_pass(const MatmulArgs& a, int64_t pb, int64_t pe, PanelFn panel_fn) {
  for (int64_t p = pb; p < pe; ++p) {
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += 4) {
      switch (std::min<int64_t>(4, a.num_tokens - t0)) {
        case 1:
          panel_fn(std::integral_constant<int, 1>{}, p, t0);
          break;
        case 2:
          panel_fn(std::integral_constant<int, 2>{}, p, t0);
          break;
        case 3:
          panel_fn(std::integral_constant<int, 3>{}, p, t0);
          break;
        default:
          panel_fn(std::integral_constant<int, 4>{}, p, t0);
          break;
      }
    }
  }
}

}  // namespace crescent::kernels::internal
