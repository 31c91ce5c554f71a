// AVX512-VNNI (256-bit, AVX512VL) row dots for Q4_K, Q5_K and Q6_K weights x Q8_K activations:
// vpdpbusd (u8 weights x s8 activations into int32, no int16 step) then one vpmulld with the
// group scales.

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

struct Dot {
  static __m256i scaled(__m256i u8, __m256i s8, __m256i scale16) {
    // Each int32 lane covers 4 bytes of one 16-byte group, so its scale is either int16 half.
    const __m256i scale32 = _mm256_srai_epi32(_mm256_slli_epi32(scale16, 16), 16);
    return _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u8, s8), scale32);
  }
  static __m256i plain(__m256i u8, __m256i s8) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u8, s8);
  }
};

#include "kernels/quant_dot_simd.inc"

}  // namespace

void fill_quant_avx512vnni(KernelTable* t) {
  fill_simd_row_dots(t);
}

}  // namespace crescent::kernels::internal
