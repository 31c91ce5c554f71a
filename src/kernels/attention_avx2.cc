// Prefill attention on AVX2 + FMA + F16C: attention_tiles.inc over 8-float vectors, lane sets as
// all-ones lanes of a vector (a masked-out FMA is blended back to its accumulator), 8
// accumulators a tile (16 ymm registers).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/aligned_buffer.h"
#include "kernels/avx2_math.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kTileAcc = 8;
using Vec = __m256;
using Mask = __m256;

inline Vec vzero() {
  return _mm256_setzero_ps();
}
inline Vec vload(const float* p) {
  return _mm256_load_ps(p);
}
inline void vstore(float* p, Vec v) {
  _mm256_store_ps(p, v);
}
inline Vec vbroadcast(float x) {
  return _mm256_set1_ps(x);
}
inline Vec vadd(Vec a, Vec b) {
  return _mm256_add_ps(a, b);
}
inline Vec vsub(Vec a, Vec b) {
  return _mm256_sub_ps(a, b);
}
inline Vec vmul(Vec a, Vec b) {
  return _mm256_mul_ps(a, b);
}
inline Vec vmax(Vec a, Vec b) {
  return _mm256_max_ps(a, b);
}
inline Vec vfmadd(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline Vec vexp(Vec x) {
  return exp_ps(x);
}
inline Vec vselect(Mask m, Vec a, Vec b) {
  return _mm256_blendv_ps(b, a, m);
}
inline Vec vmaskz(Mask m, Vec a) {
  return _mm256_and_ps(m, a);
}
inline Vec vmasked_fmadd(Vec a, Vec b, Vec c, Mask m) {
  return _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), m);
}
inline Mask lanes_above(const int32_t* vis, int64_t j) {
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(vis));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, _mm256_set1_epi32(static_cast<int32_t>(j))));
}
inline bool any_greater(Vec a, Vec b) {
  return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0;
}
inline Vec zero_where_neg_inf(Vec a) {
  const Vec neg_inf =
      _mm256_cmp_ps(a, vbroadcast(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  return _mm256_andnot_ps(neg_inf, a);
}
// bf16 is the top half of its f32; f16 widens with vcvtph2ps.
inline Vec widen(const uint16_t* src, bool f16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return f16 ? _mm256_cvtph_ps(h)
             : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#include "kernels/attention_tiles.inc"

}  // namespace

void fill_attention_avx2(KernelTable* t) {
  t->attend_rows = attend_rows;
}

}  // namespace crescent::kernels::internal
