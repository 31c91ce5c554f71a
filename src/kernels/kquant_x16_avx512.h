#pragma once
// Internal to the AVX512-VNNI kernel files (compiled with -mavx512bw -mavx512vnni): one
// super-block of an x16-interleaved K-quant panel (kquant_x16.h) unpacked into registers. Shared by
// the decode GEMV (gemv_kquant_x16_avx512vnni.cc) and the prefill GEMM's panel unpacking
// (gemm_ggml_avx512vnni.cc).
//
// A vector u below holds 4 consecutive values of each of the 16 rows in its 32-bit lanes (the
// lane order of vpdpbusd and of the GEMM's unpacked panels), made unsigned: Q2_K / Q4_K / Q5_K's
// quants as stored (0..3 / 0..15 / 0..31), Q3_K's q + 4 (0..7), Q6_K's q + 32 (0..63).
//
// Two families: Q4_K / Q5_K have 8 scale groups of 32 values with packed 6-bit scales and mins
// ("k4"); Q2_K / Q3_K / Q6_K have 16 groups of 16 ("g16"), each 64 values of a half in the
// same order, so one kernel serves the three.

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/kquant_x16.h"

namespace crescent::kernels::internal {

template <typename Block>
constexpr const KQuantX16Layout& kquant_x16_layout_of() {
  if constexpr (std::is_same_v<Block, BlockQ2_K>) {
    return kQ2KX16;
  } else if constexpr (std::is_same_v<Block, BlockQ3_K>) {
    return kQ3KX16;
  } else if constexpr (std::is_same_v<Block, BlockQ4_K>) {
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
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
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

// (q & 3) | high, one ternary-logic op.
inline __m512i low_two_bits_or(__m512i q, __m512i high) {
  return _mm512_ternarylogic_epi32(q, _mm512_set1_epi8(0x03), high, 0xEA);
}

// The g16 types. Bias: what their unsigned quants u exceed q by (q = u - bias).
template <typename Block>
constexpr int32_t g16_bias() {
  if constexpr (std::is_same_v<Block, BlockQ6_K>) {
    return 32;
  } else if constexpr (std::is_same_v<Block, BlockQ3_K>) {
    return 4;
  } else {
    static_assert(std::is_same_v<Block, BlockQ2_K>);
    return 0;
  }
}

// Column run j (< 8) of half h (< 2): u[k] (k < 4) gets values 128h + 32k + 4j..+3, which belong
// to scale group 8h + 2k + j / 4.
template <typename Block>
inline void unpack_g16_run(const uint8_t* g, int64_t h, int64_t j, __m512i* u) {
  if constexpr (std::is_same_v<Block, BlockQ6_K>) {
    // ql byte l (< 64) of half h: low nibble value 128h + l, high nibble 128h + 64 + l; qh byte
    // l (< 32): bit pairs 0-1, 2-3, 4-5, 6-7 the top bits of values 128h + l + 0 / 32 / 64 / 96.
    const uint8_t* step = g + (8 * h + j) * kQ6KX16StepBytes;
    const __m512i ql0 = load512(step + kQ6KX16.qs);
    const __m512i ql1 = load512(step + kQ6KX16.qs + 64);
    const __m512i qh = load512(step + kQ6KX16.qh);
    const __m512i top = _mm512_set1_epi8(0x30);
    u[0] = low_nibbles_or(ql0, _mm512_and_si512(_mm512_slli_epi16(qh, 4), top));
    u[1] = low_nibbles_or(ql1, _mm512_and_si512(_mm512_slli_epi16(qh, 2), top));
    u[2] = low_nibbles_or(_mm512_srli_epi16(ql0, 4), _mm512_and_si512(qh, top));
    u[3] =
        low_nibbles_or(_mm512_srli_epi16(ql1, 4), _mm512_and_si512(_mm512_srli_epi16(qh, 2), top));
  } else {
    // qs byte l (< 32) of half h: bit pairs 0-1, 2-3, 4-5, 6-7 are values 128h + l + 0 / 32 /
    // 64 / 96 (Q2_K's quants, Q3_K's low two bits). Q3_K: bit 4h + k of hmask byte l is value
    // 128h + 32k + l's third bit, set where q >= 0 (u = q + 4).
    constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
    const __m512i q = load512(g + kL.qs + (8 * h + j) * 64);
    __m512i high[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                       _mm512_setzero_si512()};
    if constexpr (std::is_same_v<Block, BlockQ3_K>) {
      const __m512i mask = load512(g + kL.qh + j * 64);
      const __m512i m = h == 0 ? mask : _mm512_srli_epi16(mask, 4);
      const __m512i bit2 = _mm512_set1_epi8(0x04);
      high[0] = _mm512_and_si512(_mm512_slli_epi16(m, 2), bit2);
      high[1] = _mm512_and_si512(_mm512_slli_epi16(m, 1), bit2);
      high[2] = _mm512_and_si512(m, bit2);
      high[3] = _mm512_and_si512(_mm512_srli_epi16(m, 1), bit2);
    }
    u[0] = low_two_bits_or(q, high[0]);
    u[1] = low_two_bits_or(_mm512_srli_epi16(q, 2), high[1]);
    u[2] = low_two_bits_or(_mm512_srli_epi16(q, 4), high[2]);
    u[3] = low_two_bits_or(_mm512_srli_epi16(q, 6), high[3]);
  }
}

// Q2_K / Q3_K for the GEMV: the runs of unpack_g16_run with each u[k] left where its bits sit
// in the stored byte, so at 4^s[k] times its value (s = g16_in_place_shift), which saves the
// shifts that move them down: a dot of them is 4^s[k] times u's, exactly, and an arithmetic
// shift by 2 s[k] undoes that. Q3_K's u[3] (bits 6-7 plus its third bit) would need bit 8, so it
// is shifted down to bits 4-6 (s = 2, like u[2]).
template <typename Block>
constexpr int g16_in_place_shift(int64_t k) {
  if constexpr (std::is_same_v<Block, BlockQ3_K>) {
    return k == 3 ? 2 : static_cast<int>(k);
  } else {
    return std::is_same_v<Block, BlockQ2_K> ? static_cast<int>(k) : 0;  // Q6_K: not in place
  }
}
// Forced inline: called from unrolled loops, GCC otherwise keeps it out of line and passes u
// through the stack (10% of Q3_K decode's samples).
template <typename Block>
[[gnu::always_inline]] inline void unpack_g16_run_in_place(const uint8_t* g, int64_t h, int64_t j,
                                                           __m512i* u) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  const __m512i q = load512(g + kL.qs + (8 * h + j) * 64);
  const auto bits = [](int v) { return _mm512_set1_epi8(static_cast<char>(v)); };
  if constexpr (std::is_same_v<Block, BlockQ2_K>) {
    for (int k = 0; k < 4; ++k) {
      u[k] = _mm512_and_si512(q, bits(3 << (2 * k)));
    }
  } else {
    // Bit 4h + k of the hmask byte goes above u[k]'s two bits: to bit 2, 4, 6 and (u[3], moved
    // down to bits 4-5) 6. Half 0 takes bits 0-3 up by 2, 3, 4, 3; half 1 bits 4-7 down by 2, 1,
    // 0, 1.
    static_assert(std::is_same_v<Block, BlockQ3_K>);
    const __m512i m = load512(g + kL.qh + j * 64);
    const __m512i a = h == 0 ? _mm512_slli_epi16(m, 2) : _mm512_srli_epi16(m, 2);
    const __m512i b = h == 0 ? _mm512_slli_epi16(m, 3) : _mm512_srli_epi16(m, 1);
    const __m512i c = h == 0 ? _mm512_slli_epi16(m, 4) : m;
    const auto pick = [](__m512i v, __m512i mask, __m512i high) {
      return _mm512_ternarylogic_epi32(v, mask, high, 0xEA);  // (v & mask) | high
    };
    u[0] = pick(q, bits(0x03), _mm512_and_si512(a, bits(0x04)));
    u[1] = pick(q, bits(0x0c), _mm512_and_si512(b, bits(0x10)));
    u[2] = pick(q, bits(0x30), _mm512_and_si512(c, bits(0x40)));
    u[3] = pick(_mm512_srli_epi16(q, 2), bits(0x30), _mm512_and_si512(b, bits(0x40)));
  }
}

// A g16 super-block's scales (and Q2_K's mins) of the 16 rows, group i as 16 int32 lanes:
// Q6_K's signed bytes as stored, Q3_K's 6-bit scales minus 32 (decoded for all 16 groups when
// constructed, kept in registers: storing them and reading 16 bytes back stalls on store
// forwarding), Q2_K's nibbles.
template <typename Block>
class G16ScalesX16 {
 public:
  explicit G16ScalesX16(const uint8_t* group) : at_(group + kquant_x16_layout_of<Block>().scales) {
    if constexpr (std::is_same_v<Block, BlockQ3_K>) {
      decode_q3k(at_);
    }
  }
  [[nodiscard]] __m512i scale(int64_t i) const {
    if constexpr (std::is_same_v<Block, BlockQ6_K>) {
      return widen_i8x16(at_ + 16 * i);
    } else if constexpr (std::is_same_v<Block, BlockQ3_K>) {
      const __m512i v = q3k_[i / 4];
      switch (i % 4) {
        case 0:
          return _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 0));
        case 1:
          return _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1));
        case 2:
          return _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2));
        default:
          return _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3));
      }
    } else {
      return _mm512_and_si512(widen_u8x16(at_ + 16 * i), _mm512_set1_epi32(0x0f));
    }
  }
  // scale(i) with the upper 16 bits of each lane zero, for vpdpwssd (Q2_K's already are).
  [[nodiscard]] __m512i scale_low16(int64_t i) const {
    if constexpr (std::is_same_v<Block, BlockQ2_K>) {
      return scale(i);
    } else {
      return _mm512_and_si512(scale(i), _mm512_set1_epi32(0xffff));
    }
  }
  // Q2_K only.
  [[nodiscard]] __m512i min(int64_t i) const {
    static_assert(std::is_same_v<Block, BlockQ2_K>);
    return _mm512_srli_epi32(widen_u8x16(at_ + 16 * i), 4);
  }
  // Q2_K only: scale(i) and min(i) from one widening of their byte.
  void scale_and_min(int64_t i, __m512i* scale, __m512i* min) const {
    static_assert(std::is_same_v<Block, BlockQ2_K>);
    const __m512i bytes = widen_u8x16(at_ + 16 * i);
    *scale = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0f));
    *min = _mm512_srli_epi32(bytes, 4);
  }

 private:
  // ggml's packing (dequantize_row_q3_K): scale i's low nibble is byte i's (i < 8) or byte
  // i - 8's high nibble, its top two bits are bits 2 (i / 4), 2 (i / 4) + 1 of byte 8 + i % 4.
  // With the bytes [byte][row], the vectors of bytes 0-3, 4-7 and 8-11 give scales 0-3, 4-7,
  // 8-11 and 12-15 in [scale][row] order.
  [[gnu::always_inline]] void decode_q3k(const uint8_t* s) {
    const __m512i a = load512(s);
    const __m512i b = load512(s + 64);
    const __m512i c = load512(s + 128);
    const __m512i top = _mm512_set1_epi8(0x30);
    const __m512i bias = _mm512_set1_epi8(32);
    const auto decode = [&](__m512i low, __m512i high) {
      return _mm512_sub_epi8(low_nibbles_or(low, _mm512_and_si512(high, top)), bias);
    };
    q3k_[0] = decode(a, _mm512_slli_epi16(c, 4));
    q3k_[1] = decode(b, _mm512_slli_epi16(c, 2));
    q3k_[2] = decode(_mm512_srli_epi16(a, 4), c);
    q3k_[3] = decode(_mm512_srli_epi16(b, 4), _mm512_srli_epi16(c, 2));
  }

  const uint8_t* at_;
  __m512i q3k_[std::is_same_v<Block, BlockQ3_K> ? 4 : 1];
};

// The group's 16 f16 (d or dmin) as f32.
inline __m512 load_f16x16(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}

}  // namespace crescent::kernels::internal
