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

// Eight consecutive blocks' f16 scales as f32: d of block i in lane i of `d8`, and for Q4_1/Q5_1
// m in lane i of `m8`. The eight blocks (144-192 bytes, read anyway) are loaded as up to three
// zmm of 16-bit words and one two-source word permute (plus a merge-masked one past word 63)
// picks the sixteen fields; one conversion makes them f32. The third load is masked to the
// blocks' bytes, so it never reads past them.
template <typename Block>
struct EightScales {
  static constexpr int kWords = static_cast<int>(sizeof(Block)) * 8 / 2;
  static_assert(sizeof(Block) % 2 == 0 && kWords > 64 && kWords <= 96);
  // Word index of block i's d (i < 8) and m (8 + i; Q4_1/Q5_1 only, d again otherwise).
  static constexpr std::array<uint16_t, 32> kIndex = [] {
    std::array<uint16_t, 32> idx{};
    for (int i = 0; i < 8; ++i) {
      idx[i] = static_cast<uint16_t>(i * sizeof(Block) / 2);
      idx[8 + i] = static_cast<uint16_t>(idx[i] + (LegacyTraits<Block>::kHasMin ? 1 : 0));
    }
    return idx;
  }();
  static constexpr uint32_t kHighLanes = [] {  // lanes whose word lies past the first 64
    uint32_t m = 0;
    for (int i = 0; i < 16; ++i)
      m |= kIndex[i] >= 64 ? 1u << i : 0u;
    return m;
  }();

  __m256 d8;
  __m256 m8;

  explicit EightScales(const Block* w) {
    const auto* p = reinterpret_cast<const uint8_t*>(w);
    const __m512i idx = _mm512_loadu_si512(kIndex.data());
    __m512i f = _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx, _mm512_loadu_si512(p + 64));
    if constexpr (kHighLanes != 0) {
      const __m512i tail = _mm512_maskz_loadu_epi16(
          static_cast<__mmask32>((uint64_t{1} << (kWords - 64)) - 1), p + 128);
      f = _mm512_mask_permutexvar_epi16(f, kHighLanes, idx, tail);  // index mod 32 = word - 64
    }
    const __m512 both = _mm512_cvtph_ps(_mm512_castsi512_si256(f));
    d8 = _mm512_castps512_ps256(both);
    m8 = _mm512_extractf32x8_ps(both, 1);
  }
};

// The legacy types with fewer instructions per block than the shared dot_legacy, which batch-1
// decode is bound by (its weights are read once, so each block's instructions must fit in the
// time memory takes to deliver its 18-24 bytes): seven vector instructions a Q5_0 block.
// - The quants stay unsigned (Q4_0/Q5_0 nibbles, IQ4_NL levels + 128) and the dot starts from
//   zero; the offset's share, offset * sum(x) * scale per block, is taken off eight blocks at a
//   time from the activation block sums (one FMA per eight blocks): no sign instructions.
// - Both nibble halves come from one broadcast load and one per-qword variable shift.
// - Q5's fifth bits: a mask register loaded straight from qh selects 0x10 bytes (one zero-masked
//   move), and one ternary-logic op merges them with the masked nibbles.
// - The block scales d * dx are made eight blocks at a time (EightScales, one multiply) and stored;
//   each block's FMA reads its scale as a broadcast memory operand, so no lane shuffles.
// - Even and odd blocks accumulate apart: one FMA chain would cost its 4-cycle latency a block.
// Each block's integer dot is exact; the offset's share is subtracted in f32 after the scale,
// summed over the row, so rounding differs from ggml's per-block int32 by a few ulps of the
// row's offset term (offset * sum of d * dx * sum(x); ~1e-5 relative for IQ4_NL's 128).
template <typename Block, int T>
void dot_legacy_vnni(int64_t n, const void* w_row, const QuantizedActs* x, float* out) {
  constexpr bool kHasMin = LegacyTraits<Block>::kHasMin;
  constexpr bool kHasHigh = LegacyTraits<Block>::kHasHigh;
  constexpr bool kNonLinear = LegacyTraits<Block>::kNonLinear;
  constexpr int32_t kOffset = kHasMin ? 0 : (kNonLinear ? 128 : (kHasHigh ? 16 : 8));
  constexpr int kChains = 2;  // FMA chains (even and odd blocks)
  const auto* w = static_cast<const Block*>(w_row);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i nibble_shift = _mm256_set_epi64x(4, 4, 0, 0);  // values 0-15 low, 16-31 high
  const __m256i levels = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLUnsigned.data())));
  // Block b's 32 quants as unsigned bytes (value = quant + kOffset).
  const auto unsigned_quants = [&](int64_t b) __attribute__((always_inline)) {
    const __m256i q = _mm256_srlv_epi64(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs))),
        nibble_shift);
    __m256i v;
    if constexpr (kHasHigh) {
      uint32_t qh;
      std::memcpy(&qh, w[b].qh, 4);
      const __m256i high = _mm256_maskz_mov_epi8(_cvtu32_mask32(qh), bit4);
      v = _mm256_ternarylogic_epi32(q, low4, high, 0xEA);  // (q & low4) | high
    } else {
      v = _mm256_and_si256(q, low4);
    }
    if constexpr (kNonLinear)
      v = _mm256_shuffle_epi8(levels, v);
    return v;
  };
  const auto block_dot = [&](int64_t b, __m256i v, int t) __attribute__((always_inline)) {
    return _mm256_cvtepi32_ps(
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), v, load256(x[t].q8_0 + 32 * b)));
  };
  __m256 acc[kChains][T];
  __m256 acc_sum[T];  // sum over blocks of scale * sum(x): the offset's (or Q4_1/Q5_1 min's) share
  for (int t = 0; t < T; ++t) {
    for (int c = 0; c < kChains; ++c)
      acc[c][t] = _mm256_setzero_ps();
    acc_sum[t] = _mm256_setzero_ps();
  }
  const int64_t num_blocks = n / 32;
  int64_t b = 0;
  for (; b + 8 <= num_blocks; b += 8) {
    const EightScales<Block> scales8(w + b);
    const __m256 d8 = scales8.d8;
    alignas(32) float scale[T][8];
    for (int t = 0; t < T; ++t) {
      const __m256 dx8 = _mm256_loadu_ps(x[t].q8_0_scale + b);
      const __m256 sum8 = _mm256_cvtepi32_ps(load256(x[t].q8_0_sum + b));
      const __m256 scale8 = _mm256_mul_ps(d8, dx8);
      _mm256_store_ps(scale[t], scale8);
      if constexpr (kHasMin) {
        acc_sum[t] = _mm256_fmadd_ps(_mm256_mul_ps(scales8.m8, dx8), sum8, acc_sum[t]);
      } else {
        acc_sum[t] = _mm256_fmadd_ps(scale8, sum8, acc_sum[t]);
      }
    }
    // Left to itself the compiler keeps the scales in registers and spends two shuffles a block
    // broadcasting them; through memory each is an FMA's broadcast operand, for free.
    asm("" : "+m"(scale));
    for (int i = 0; i < 8; ++i) {
      const __m256i v = unsigned_quants(b + i);
      for (int t = 0; t < T; ++t) {
        acc[i % kChains][t] = _mm256_fmadd_ps(block_dot(b + i, v, t), _mm256_set1_ps(scale[t][i]),
                                              acc[i % kChains][t]);
      }
    }
  }
  float tail_sum[T] = {};
  for (; b < num_blocks; ++b) {
    const __m256i v = unsigned_quants(b);
    const float d = f16(w[b].d);
    for (int t = 0; t < T; ++t) {
      const float dx = x[t].q8_0_scale[b];
      acc[0][t] = _mm256_fmadd_ps(block_dot(b, v, t), _mm256_set1_ps(d * dx), acc[0][t]);
      float m = d;
      if constexpr (kHasMin)
        m = f16(w[b].m);
      tail_sum[t] += m * dx * static_cast<float>(x[t].q8_0_sum[b]);
    }
  }
  // Q4_1/Q5_1 add m * dx * sum(x); the others take off offset * d * dx * sum(x).
  constexpr float kSumWeight = kHasMin ? 1.0f : -static_cast<float>(kOffset);
  for (int t = 0; t < T; ++t) {
    __m256 dots = acc[0][t];
    for (int c = 1; c < kChains; ++c)
      dots = _mm256_add_ps(dots, acc[c][t]);
    out[t] = hsum_ps(dots) + kSumWeight * (hsum_ps(acc_sum[t]) + tail_sum[t]);
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
