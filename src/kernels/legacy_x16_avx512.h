#pragma once
// Internal to the AVX512-VNNI kernel files (compiled with -mavx512bw -mavx512vnni): one block of
// an x16-interleaved legacy panel (legacy_x16.h) unpacked into registers. Shared by the decode
// GEMV (gemv_legacy_x16_avx512vnni.cc) and the prefill GEMM's panel unpacking.

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/legacy_x16.h"

namespace crescent::kernels::internal {

template <typename Block>
struct LegacyX16 : LegacyBlockTraits<Block> {
  using Traits = LegacyBlockTraits<Block>;
  // What the unsigned quants u carry above the signed value: w = d * (u - kBias) for the types
  // without a min, w = d * u + m for Q4_1 / Q5_1.
  static constexpr int32_t kBias =
      Traits::kHasMin ? 0 : (Traits::kNonLinear ? 128 : (Traits::kHasHigh ? 16 : 8));
  static constexpr LegacyX16Layout kLayout = legacy_x16_layout_of<Block>();
  static constexpr int64_t kGroupBytes = kLayout.group_bytes;
  static constexpr int64_t kDOffset = kLayout.d_offset;
  static constexpr int64_t kMOffset = kLayout.m_offset;
  static constexpr int64_t kQhOffset = kLayout.qh_offset;
};

// IQ4_NL's levels plus 128 (unsigned, vpdpbusd's u8 operand), in every 128-bit lane.
inline __m512i iq4nl_unsigned_levels() {
  alignas(16) std::array<uint8_t, 16> u{};
  for (int i = 0; i < 16; ++i) {
    u[i] = static_cast<uint8_t>(kIQ4NLValues[i] + 128);
  }
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(u.data())));
}

// Column runs 0..7 of a group (values 4j..4j+3 of each of the 16 rows in the 32-bit lanes of
// u[j]) as unsigned quants: the stored nibbles, plus 16 for the fifth bits, through IQ4_NL's
// table. `levels` is iq4nl_unsigned_levels() (unused otherwise).
template <typename Block>
inline void unpack_x16_group(const uint8_t* g, __m512i levels, __m512i* u) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t j = 0; j < 4; ++j) {
    const __m512i q = _mm512_loadu_si512(g + 64 * j);
    const __m512i hi = _mm512_srli_epi16(q, 4);
    if constexpr (LegacyX16<Block>::kHasHigh) {
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      uint64_t m_lo;
      uint64_t m_hi;
      std::memcpy(&m_lo, g + LegacyX16<Block>::kQhOffset + 8 * j, 8);
      std::memcpy(&m_hi, g + LegacyX16<Block>::kQhOffset + 8 * (j + 4), 8);
      // (q & 15) | fifth bit, one ternary-logic op each.
      u[j] = _mm512_ternarylogic_epi32(q, low4, _mm512_maskz_mov_epi8(_cvtu64_mask64(m_lo), bit4),
                                       0xEA);
      u[j + 4] = _mm512_ternarylogic_epi32(hi, low4,
                                           _mm512_maskz_mov_epi8(_cvtu64_mask64(m_hi), bit4), 0xEA);
    } else {
      u[j] = _mm512_and_si512(q, low4);
      u[j + 4] = _mm512_and_si512(hi, low4);
    }
    if constexpr (LegacyX16<Block>::kNonLinear) {
      u[j] = _mm512_shuffle_epi8(levels, u[j]);
      u[j + 4] = _mm512_shuffle_epi8(levels, u[j + 4]);
    } else {
      (void)levels;
    }
  }
}

// The group's 16 scales (d) or mins (m) as f32.
inline __m512 load_x16_f16s(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}

}  // namespace crescent::kernels::internal
