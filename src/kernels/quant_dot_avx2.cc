// AVX2 row dots for Q4_K, Q5_K and Q6_K weights x Q8_K activations: vpmaddubsw (u8 weights x
// s8 activations, exact: every pair sum fits int16) then vpmaddwd with the group scales.

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/kernel_table.h"
#include "kernels/legacy_x16.h"

namespace crescent::kernels::internal {
namespace {

struct Dot {
  static __m256i scaled(__m256i u8, __m256i s8, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), scale16);
  }
  static __m256i plain(__m256i u8, __m256i s8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1));
  }
};

#include "kernels/quant_dot_simd.inc"

}  // namespace

void fill_quant_avx2(KernelTable* t) {
  fill_simd_row_dots(t);
}

}  // namespace crescent::kernels::internal
