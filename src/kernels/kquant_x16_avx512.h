#pragma once
// Internal to the AVX512-VNNI kernel files (compiled with -mavx512bw -mavx512vnni): one
// super-block of an x16-interleaved Q4_K / Q5_K / Q6_K panel (kquant_x16.h) unpacked into
// registers. Shared by the decode GEMV (gemv_kquant_x16_avx512vnni.cc) and the prefill GEMM's
// panel unpacking (gemm_ggml_avx512vnni.cc).
//
// A vector u below holds 4 consecutive values of each of the 16 rows in its 32-bit lanes (the
// lane order of vpdpbusd and of the GEMM's unpacked panels), made unsigned: Q4_K / Q5_K's quants
// as stored (0..15 / 0..31), Q6_K's q + 32 (0..63).

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/kquant_x16.h"

namespace crescent::kernels::internal {

template <typename Block>
constexpr const KQuantX16Layout& kquant_x16_layout_of() {
  if constexpr (std::is_same_v<Block, BlockQ4_K>) {
    return kQ4KX16;
  } else if constexpr (std::is_same_v<Block, BlockQ5_K>) {
    return kQ5KX16;
  } else {
    static_assert(std::is_same_v<Block, BlockQ6_K>);
    return kQ6KX16;
  }
}

inline __m512i load512(const uint8_t* p) {
  return _mm512_loadu_si512(p);
}
// (q & 15) | high, one ternary-logic op.
inline __m512i low_nibbles_or(__m512i q, __m512i high) {
  return _mm512_ternarylogic_epi32(q, _mm512_set1_epi8(0x0f), high, 0xEA);
}

// Q4_K / Q5_K: the 6-bit scales and mins of a group's 8 sub-blocks, as bytes [sub-block][row].
struct K4ScalesX16 {
  alignas(64) uint8_t scale[8 * 16];
  alignas(64) uint8_t min[8 * 16];
};
// `s` is the group's 12 scale bytes of 16 rows ([byte][row]). ggml's packing (get_scale_min_k4):
// bytes 0-3 hold scales 0-3 in bits 0-5 and the top bits of scales 4-7 in bits 6-7; bytes 4-7
// the same for the mins; bytes 8-11 the low nibbles of scales 4-7 and, above, of mins 4-7.
inline void decode_k4_scales_x16(const uint8_t* s, K4ScalesX16* out) {
  const __m512i a = load512(s);
  const __m512i b = load512(s + 64);
  const __m512i c = load512(s + 128);
  const __m512i six = _mm512_set1_epi8(0x3f);
  const __m512i top = _mm512_set1_epi8(0x30);
  _mm512_store_si512(out->scale, _mm512_and_si512(a, six));
  _mm512_store_si512(out->min, _mm512_and_si512(b, six));
  _mm512_store_si512(out->scale + 64,
                     low_nibbles_or(c, _mm512_and_si512(_mm512_srli_epi16(a, 2), top)));
  _mm512_store_si512(out->min + 64, low_nibbles_or(_mm512_srli_epi16(c, 4),
                                                   _mm512_and_si512(_mm512_srli_epi16(b, 2), top)));
}
// Sub-block i's 16 bytes (scales, mins or Q6_K's signed scales) as 16 int32 lanes.
inline __m512i widen_u8x16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m512i widen_i8x16(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Q4_K / Q5_K, column run j (< 8) of 64-value chunk c (< 4): *lo gets values 64c + 4j..+3 (of
// sub-block 2c), *hi values 64c + 32 + 4j..+3 (sub-block 2c + 1).
template <typename Block>
inline void unpack_k4_run(const uint8_t* g, int64_t c, int64_t j, __m512i* lo, __m512i* hi) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  const __m512i q = load512(g + kL.qs + (8 * c + j) * 64);
  const __m512i q_hi = _mm512_srli_epi16(q, 4);
  if constexpr (std::is_same_v<Block, BlockQ5_K>) {
    // Bit 2c of qh byte l is the fifth bit of value 64c + l, bit 2c + 1 that of 64c + 32 + l.
    const __m512i h = load512(g + kL.qh + j * 64);
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    const auto to_bit4 = [&](int64_t bit) {
      const __m512i moved = bit <= 4 ? _mm512_sll_epi16(h, _mm_cvtsi64_si128(4 - bit))
                                     : _mm512_srl_epi16(h, _mm_cvtsi64_si128(bit - 4));
      return _mm512_and_si512(moved, bit4);
    };
    *lo = low_nibbles_or(q, to_bit4(2 * c));
    *hi = low_nibbles_or(q_hi, to_bit4(2 * c + 1));
  } else {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    *lo = _mm512_and_si512(q, nibble);
    *hi = _mm512_and_si512(q_hi, nibble);
  }
}

// Q6_K, column run j (< 8) of half h (< 2): u[k] gets values 128h + 32k + 4j..+3, which belong
// to scale group 8h + 2k + j / 4.
inline void unpack_q6k_run(const uint8_t* g, int64_t h, int64_t j, __m512i* u) {
  // ql byte l (< 64) of half h: low nibble value 128h + l, high nibble 128h + 64 + l; qh byte l
  // (< 32): bit pairs 0-1, 2-3, 4-5, 6-7 the top bits of values 128h + l + 0 / 32 / 64 / 96.
  const uint8_t* step = g + (8 * h + j) * kQ6KX16StepBytes;
  const __m512i ql0 = load512(step + kQ6KX16.qs);
  const __m512i ql1 = load512(step + kQ6KX16.qs + 64);
  const __m512i qh = load512(step + kQ6KX16.qh);
  const __m512i top = _mm512_set1_epi8(0x30);
  u[0] = low_nibbles_or(ql0, _mm512_and_si512(_mm512_slli_epi16(qh, 4), top));
  u[1] = low_nibbles_or(ql1, _mm512_and_si512(_mm512_slli_epi16(qh, 2), top));
  u[2] = low_nibbles_or(_mm512_srli_epi16(ql0, 4), _mm512_and_si512(qh, top));
  u[3] = low_nibbles_or(_mm512_srli_epi16(ql1, 4), _mm512_and_si512(_mm512_srli_epi16(qh, 2), top));
}

// The group's 16 f16 (d or dmin) as f32.
inline __m512 load_f16x16(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}

}  // namespace crescent::kernels::internal
