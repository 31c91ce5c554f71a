// The legacy types' row dots on AVX512-VNNI machines (256-bit, AVX512VL): dot_legacy_vnni
// below. The K-quants keep the AVX2 table's kernels (quant_dot_simd.inc): their scaled dot,
// vpmaddubsw then vpmaddwd with the group scales, is two instructions per 32 bytes, where
// vpdpbusd would need the scales widened to int32 and a vpmulld after it, four (batch-1 Q4_K
// decode 14.6 -> 16.2-16.4 GB/s on one thread when the VNNI form was dropped; Q6_K within noise).

#include <immintrin.h>

#include <array>
#include <cstring>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

#include "kernels/quant_dot_simd_common.inc"

// IQ4_NL's levels plus 128: unsigned, so they can be vpdpbusd's u8 operand.
constexpr std::array<uint8_t, 16> kIQ4NLUnsigned = [] {
  std::array<uint8_t, 16> u{};
  for (int i = 0; i < 16; ++i)
    u[i] = static_cast<uint8_t>(kIQ4NLValues[i] + 128);
  return u;
}();

// Eight consecutive blocks' f16 fields (d or m) as f32: gathered in general registers, whose
// pipes the vector work leaves idle, and converted with one instruction.
template <typename Block, uint16_t Block::*kField>
__m256 eight_f16(const Block* w) {
  uint64_t lo = 0;
  uint64_t hi = 0;
  for (int i = 0; i < 4; ++i) {
    lo |= uint64_t{w[i].*kField} << (16 * i);
    hi |= uint64_t{w[4 + i].*kField} << (16 * i);
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo)));
}

// The legacy types with fewer instructions per block than the shared dot_legacy, which batch-1
// decode is bound by (its weights are read once, so each block's instructions must fit in the
// time memory takes to deliver its 18-24 bytes):
// - the quants stay unsigned (Q4_0/Q5_0 nibbles, IQ4_NL levels + 128) and the offset is
//   subtracted exactly through the dot's accumulator start, -offset * (sum of the activation
//   block), which the activations carry: no sign instructions;
// - both nibble halves come from one broadcast load and one per-qword variable shift;
// - Q5's fifth bits are a mask register loaded straight from qh, added in with one masked add
//   (the AVX2 form spends five instructions spreading them into bytes);
// - the block scales d * dx are made eight blocks at a time (eight_f16, one multiply) and each
//   block takes its own with one lane permute; Q4_1/Q5_1's m * dx * sum likewise, vectorised;
// - even and odd blocks accumulate apart: one FMA chain would cost its 4-cycle latency a block.
// Each lane's integer is exact; the offset (in lane 0) cancels against the other lanes in f32
// after the scale, so rounding differs from ggml's per-block int32 by a few ulps of the block.
template <typename Block, int T>
void dot_legacy_vnni(int64_t n, const void* w_row, const QuantizedActs* x, float* out) {
  constexpr bool kHasMin = LegacyTraits<Block>::kHasMin;
  constexpr bool kHasHigh = LegacyTraits<Block>::kHasHigh;
  constexpr bool kNonLinear = LegacyTraits<Block>::kNonLinear;
  constexpr int32_t kOffset = kHasMin ? 0 : (kNonLinear ? 128 : (kHasHigh ? 16 : 8));
  const auto* w = static_cast<const Block*>(w_row);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i nibble_shift = _mm256_set_epi64x(4, 4, 0, 0);  // values 0-15 low, 16-31 high
  const __m256i levels = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLUnsigned.data())));
  // The exact int32 dot of block b with token t's activations (offset included).
  const auto block_dot = [&](int64_t b, __m256i v, int t) __attribute__((always_inline)) {
    const __m256i start =
        kOffset != 0 ? _mm256_zextsi128_si256(_mm_cvtsi32_si128(-kOffset * x[t].q8_0_sum[b]))
                     : _mm256_setzero_si256();
    return _mm256_dpbusd_epi32(start, v, load256(x[t].q8_0 + 32 * b));
  };
  const auto unsigned_quants = [&](int64_t b) __attribute__((always_inline)) {
    const __m256i q =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs)));
    __m256i v = _mm256_and_si256(_mm256_srlv_epi64(q, nibble_shift), low4);
    if constexpr (kHasHigh) {
      uint32_t qh;
      std::memcpy(&qh, w[b].qh, 4);
      v = _mm256_mask_add_epi8(v, _cvtu32_mask32(qh), v, bit4);
    }
    if constexpr (kNonLinear)
      v = _mm256_shuffle_epi8(levels, v);
    return v;
  };
  __m256 acc[2][T];
  __m256 acc_min[T];
  for (int t = 0; t < T; ++t) {
    acc[0][t] = _mm256_setzero_ps();
    acc[1][t] = _mm256_setzero_ps();
    acc_min[t] = _mm256_setzero_ps();
  }
  const int64_t num_blocks = n / 32;
  int64_t b = 0;
  for (; b + 8 <= num_blocks; b += 8) {
    const __m256 d8 = eight_f16<Block, &Block::d>(w + b);
    __m256 scale8[T];
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (kHasMin)
      m8 = eight_f16<Block, &Block::m>(w + b);
    for (int t = 0; t < T; ++t) {
      const __m256 dx8 = _mm256_loadu_ps(x[t].q8_0_scale + b);
      scale8[t] = _mm256_mul_ps(d8, dx8);
      if constexpr (kHasMin) {
        const __m256 sum8 = _mm256_cvtepi32_ps(load256(x[t].q8_0_sum + b));
        acc_min[t] = _mm256_fmadd_ps(_mm256_mul_ps(m8, dx8), sum8, acc_min[t]);
      }
    }
    for (int i = 0; i < 8; ++i) {
      const __m256i v = unsigned_quants(b + i);
      const __m256i lane = _mm256_set1_epi32(i);
      for (int t = 0; t < T; ++t) {
        acc[i % 2][t] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale8[t], lane),
                                        _mm256_cvtepi32_ps(block_dot(b + i, v, t)), acc[i % 2][t]);
      }
    }
  }
  float tail_min[T] = {};
  for (; b < num_blocks; ++b) {
    const __m256i v = unsigned_quants(b);
    const float d = f16(w[b].d);
    for (int t = 0; t < T; ++t) {
      const float dx = x[t].q8_0_scale[b];
      acc[0][t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(block_dot(b, v, t)),
                                  acc[0][t]);
      if constexpr (kHasMin)
        tail_min[t] += f16(w[b].m) * dx * static_cast<float>(x[t].q8_0_sum[b]);
    }
  }
  for (int t = 0; t < T; ++t) {
    out[t] = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0][t], acc[1][t]), acc_min[t])) + tail_min[t];
  }
}

template <typename Block>
struct LegacyVnni {
  template <int T>
  struct Kernel {
    static void run(int64_t n, const void* w, const QuantizedActs* x, float* out) {
      dot_legacy_vnni<Block, T>(n, w, x, out);
    }
  };
};

}  // namespace

void fill_quant_avx512vnni(KernelTable* t) {
  t->row_dot[static_cast<int>(DType::kQ4_0)] = dot_tokens<LegacyVnni<BlockQ4_0>::Kernel>;
  t->row_dot[static_cast<int>(DType::kQ4_1)] = dot_tokens<LegacyVnni<BlockQ4_1>::Kernel>;
  t->row_dot[static_cast<int>(DType::kQ5_0)] = dot_tokens<LegacyVnni<BlockQ5_0>::Kernel>;
  t->row_dot[static_cast<int>(DType::kQ5_1)] = dot_tokens<LegacyVnni<BlockQ5_1>::Kernel>;
  t->row_dot[static_cast<int>(DType::kIQ4_NL)] = dot_tokens<LegacyVnni<BlockIQ4_NL>::Kernel>;
}

}  // namespace crescent::kernels::internal
