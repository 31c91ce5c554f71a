// Prefill attention on AVX-512 (F/BW/VL/DQ): attention_tiles.inc over 16-float vectors, lane
// sets in mask registers (a masked-out FMA keeps its accumulator), 16 accumulators a tile.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/aligned_buffer.h"
#include "kernels/avx512_math.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kTileAcc = 16;
using Vec = __m512;
using Mask = __mmask16;

inline Vec vzero() {
  return _mm512_setzero_ps();
}
inline Vec vload(const float* p) {
  return _mm512_load_ps(p);
}
inline void vstore(float* p, Vec v) {
  _mm512_store_ps(p, v);
}
inline Vec vbroadcast(float x) {
  return _mm512_set1_ps(x);
}
inline Vec vadd(Vec a, Vec b) {
  return _mm512_add_ps(a, b);
}
inline Vec vsub(Vec a, Vec b) {
  return _mm512_sub_ps(a, b);
}
inline Vec vmul(Vec a, Vec b) {
  return _mm512_mul_ps(a, b);
}
inline Vec vmax(Vec a, Vec b) {
  return _mm512_max_ps(a, b);
}
inline Vec vfmadd(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline Vec vexp(Vec x) {
  return exp_ps(x);
}
inline Vec vselect(Mask m, Vec a, Vec b) {
  return _mm512_mask_mov_ps(b, m, a);
}
inline Vec vmaskz(Mask m, Vec a) {
  return _mm512_maskz_mov_ps(m, a);
}
inline Vec vmasked_fmadd(Vec a, Vec b, Vec c, Mask m) {
  return _mm512_mask3_fmadd_ps(a, b, c, m);
}
inline Mask lanes_above(const int32_t* vis, int64_t j) {
  return _mm512_cmpgt_epi32_mask(_mm512_load_si512(vis),
                                 _mm512_set1_epi32(static_cast<int32_t>(j)));
}
inline bool any_greater(Vec a, Vec b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0;
}
inline Vec zero_where_neg_inf(Vec a) {
  const Mask neg_inf =
      _mm512_cmp_ps_mask(a, vbroadcast(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(a, neg_inf, vzero());
}
// bf16 is the top half of its f32; f16 widens with vcvtph2ps.
inline Vec widen(const uint16_t* src, bool f16) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return f16 ? _mm512_cvtph_ps(h)
             : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#include "kernels/attention_tiles.inc"

}  // namespace

void fill_attention_avx512(KernelTable* t) {
  t->attend_rows = attend_rows;
}

}  // namespace crescent::kernels::internal
