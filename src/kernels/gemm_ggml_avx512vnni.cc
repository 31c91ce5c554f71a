// AVX512-VNNI GEMM for the ggml block types (Q4_0 ... Q6_K) when many tokens share a weight
// (prefill). The row dots (quant_dot_*.cc) unpack every weight block again for each group of
// kMaxDotTokens tokens; here each pair of 16-row panels is unpacked once per matmul into a
// per-thread scratch that stays in L2 — u8 quants laid out as vpdpbusd wants them (4 values of
// one row per int32 lane, 16 rows per vector) plus an f32 scale and offset per row and group —
// and then every token runs against it in a register tile of 2 panels x 6 tokens (legacy types)
// or 4 (K-quants).
//
// Why not repack at load: the unpacked form is ~2.5x the bytes of Q4_K, and batch-1 decode,
// which is bound by reading those bytes, keeps streaming the stored blocks. Unpacking per matmul
// costs about one pass over the weight, small next to 16+ tokens of multiply-adds. The legacy
// types are stored x16-interleaved on these CPUs (legacy_x16.h), already in the unpacked lane
// order, so theirs is a few masked-nibble stores per block.
//
// Arithmetic: a weight value is scale[g] * (u - bias) + offset[g] (u the quant made unsigned by
// the type's bias, g its group of 16 or 32 values); with the activation x = dx * q (dx per
// activation block), a group contributes dx * (scale * sum((u - bias) * q) + offset * sum(q)),
// the first sum exact in int32, the offset term only for the types with a min (Q4_1, Q5_1,
// Q2_K, Q4_K, Q5_K).

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "core/check.h"
#include "kernels/aligned_buffer.h"
#include "kernels/kernel_table.h"
#include "kernels/kquant_x16_avx512.h"
#include "kernels/legacy_x16_avx512.h"
#include "kernels/quant_unpack.h"

namespace crescent::kernels::internal {
namespace {

constexpr int64_t kR = kPanelRows;

// One 16-row panel unpacked: quants[k / 4][row][k % 4] (k < padded cols), scale and offset
// [group][row].
struct UnpackedPanel {
  uint8_t* quants = nullptr;
  float* scale = nullptr;
  float* offset = nullptr;
};

// Per-thread scratch for two panels, grown to the largest weight seen.
class Scratch {
 public:
  void reserve(int64_t padded_cols, int group_size) {
    // The transposes write whole runs of 64 columns (a legacy type's last run may be 32).
    const int64_t quant_bytes = (padded_cols + 63) / 64 * 64 * kR;
    const int64_t param_bytes = padded_cols / group_size * kR * static_cast<int64_t>(sizeof(float));
    const int64_t panel_bytes = quant_bytes + 2 * param_bytes;
    std::byte* buffer = buffer_.reserve(2 * panel_bytes, "the GEMM scratch");
    for (int i = 0; i < 2; ++i) {
      std::byte* base = buffer + i * panel_bytes;
      panels_[i].quants = reinterpret_cast<uint8_t*>(base);
      panels_[i].scale = reinterpret_cast<float*>(base + quant_bytes);
      panels_[i].offset = reinterpret_cast<float*>(base + quant_bytes + param_bytes);
    }
  }
  [[nodiscard]] const UnpackedPanel& panel(int i) const { return panels_[i]; }

 private:
  GrowOnlyBuffer buffer_;
  UnpackedPanel panels_[2];
};

// Up to 256 columns of the 16 rows, row-major, before they are interleaved into the panel.
constexpr int kTileCols = kQKBlockSize;
using RowTile = uint8_t[kR][kTileCols];

// The 32 quants of a legacy block made unsigned (q + bias: the stored 4 or 5 bits; IQ4_NL's
// levels + 128).
template <typename Block>
inline void legacy_block_u8(const Block& b, uint8_t* u) {
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  __m256i v =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), nibble), _mm_and_si128(qs, nibble));
  if constexpr (std::is_same_v<Block, BlockIQ4_NL>) {
    const __m256i levels = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    v = _mm256_xor_si256(_mm256_shuffle_epi8(levels, v), _mm256_set1_epi8(-128));
  }
  if constexpr (requires { b.qh; }) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);  // bit j is bit 4 of value j
    v = _mm256_or_si256(v, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(u), v);
}

// The legacy types (32 values per block, one group): w = d * q + m with q signed for Q4_0 / Q5_0
// (bias 8 / 16 makes it unsigned).
template <typename Block>
void unpack_legacy_row(const Block* blocks, int64_t b0, int64_t b1, int row, uint8_t* u,
                       const UnpackedPanel& out) {
  for (int64_t b = b0; b < b1; ++b, u += 32) {
    legacy_block_u8(blocks[b], u);
    out.scale[b * kR + row] = _cvtsh_ss(blocks[b].d);
    if constexpr (requires { blocks[b].m; }) {
      out.offset[b * kR + row] = _cvtsh_ss(blocks[b].m);
    } else {
      out.offset[b * kR + row] = 0.0f;
    }
  }
}

inline __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline void store256(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// Bit `bit` of every byte of h moved to bit 4 (other bits cleared).
inline __m256i bit_to_4(__m256i h, int bit) {
  const __m256i moved = bit <= 4 ? _mm256_slli_epi16(h, 4 - bit) : _mm256_srli_epi16(h, bit - 4);
  return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

// A K-quant block's 256 quants made unsigned (q + bias) and its group scales: vector code for the
// types llama-quantize's _M mixes use most (Q4_K, Q5_K, Q6_K), quant_unpack.h's scalar unpacker
// for the others.
template <typename Block, int kBias>
inline void k_block_u8(const Block& b, uint8_t* u, KScales* s) {
  int8_t q[kQKBlockSize];
  unpack_k(b, q, s);
  for (int i = 0; i < kQKBlockSize; ++i) {
    u[i] = static_cast<uint8_t>(q[i] + kBias);
  }
}

template <typename Block>
inline void k4_scales(const Block& b, KScales* s) {
  s->d = _cvtsh_ss(b.d);
  s->dmin = _cvtsh_ss(b.dmin);
  s->num_groups = 8;
  for (int j = 0; j < 8; ++j) {
    get_scale_min_k4(j, b.scales, &s->scale[j], &s->min[j]);
  }
}

template <>
inline void k_block_u8<BlockQ4_K, 0>(const BlockQ4_K& b, uint8_t* u, KScales* s) {
  k4_scales(b, s);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  for (int64_t k = 0; k < 4; ++k) {
    const __m256i q = load256(b.qs + 32 * k);
    store256(u + 64 * k, _mm256_and_si256(q, nibble));
    store256(u + 64 * k + 32, _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble));
  }
}

template <>
inline void k_block_u8<BlockQ5_K, 0>(const BlockQ5_K& b, uint8_t* u, KScales* s) {
  k4_scales(b, s);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i h = load256(b.qh);
  for (int64_t k = 0; k < 4; ++k) {
    const __m256i q = load256(b.qs + 32 * k);
    store256(u + 64 * k, _mm256_or_si256(_mm256_and_si256(q, nibble), bit_to_4(h, 2 * k)));
    store256(u + 64 * k + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nibble),
                                              bit_to_4(h, 2 * k + 1)));
  }
}

template <>
inline void k_block_u8<BlockQ6_K, 32>(const BlockQ6_K& b, uint8_t* u, KScales* s) {
  s->d = _cvtsh_ss(b.d);
  s->dmin = 0;
  s->num_groups = 16;
  for (int g = 0; g < 16; ++g) {
    s->scale[g] = b.scales[g];  // NOLINT(bugprone-signed-char-misuse): Q6_K's scales are signed
    s->min[g] = 0;
  }
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i two = _mm256_set1_epi8(0x30);
  for (int64_t h = 0; h < 2; ++h) {
    const __m256i a = load256(b.ql + 64 * h);
    const __m256i c = load256(b.ql + 64 * h + 32);
    const __m256i hi = load256(b.qh + 32 * h);
    uint8_t* y = u + 128 * h;
    // Value l: low nibble of ql[l], bits 0-1 of qh[l]; l + 32: ql[l + 32], bits 2-3; l + 64:
    // high nibble of ql[l], bits 4-5; l + 96: high nibble of ql[l + 32], bits 6-7.
    store256(y, _mm256_or_si256(_mm256_and_si256(a, nibble),
                                _mm256_and_si256(_mm256_slli_epi16(hi, 4), two)));
    store256(y + 32, _mm256_or_si256(_mm256_and_si256(c, nibble),
                                     _mm256_and_si256(_mm256_slli_epi16(hi, 2), two)));
    store256(y + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), nibble),
                                     _mm256_and_si256(hi, two)));
    store256(y + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), nibble),
                                     _mm256_and_si256(_mm256_srli_epi16(hi, 2), two)));
  }
}

// The K-quants (256 values, 8 groups of 32 or 16 of 16): w = d * scale[g] * q - dmin * min[g],
// q signed for Q6_K / Q3_K (bias 32 / 4).
template <typename Block, int kBias>
void unpack_k_row(const Block* blocks, int64_t b, int row, uint8_t* u, const UnpackedPanel& out) {
  KScales s;
  k_block_u8<Block, kBias>(blocks[b], u, &s);
  for (int g = 0; g < s.num_groups; ++g) {
    const int64_t gi = (b * s.num_groups + g) * kR + row;
    out.scale[gi] = s.d * static_cast<float>(s.scale[g]);
    out.offset[gi] = -s.dmin * static_cast<float>(s.min[g]);
  }
}

// Columns [k0, k1) of row r (k0 a multiple of 256, k1 - k0 <= 256) as u8 quants at u, and the
// row's scales and offsets of those columns.
using UnpackRowFn = void (*)(const void* row, int64_t k0, int64_t k1, int r, uint8_t* u,
                             const UnpackedPanel&);

template <typename Block, int kBias, bool kK>
void unpack_row(const void* row, int64_t k0, int64_t k1, int r, uint8_t* u,
                const UnpackedPanel& out) {
  const auto* blocks = static_cast<const Block*>(row);
  if constexpr (kK) {
    unpack_k_row<Block, kBias>(blocks, k0 / kQKBlockSize, r, u, out);
  } else {
    unpack_legacy_row<Block>(blocks, k0 / 32, k1 / 32, r, u, out);
  }
}

// 64 columns of the tile's 16 rows (row stride kTileCols) into the panel order: 16 vectors, the
// j-th holding columns 4j..4j+3 of every row (a 16 x 16 transpose of int32s).
inline void transpose_into_panel(const uint8_t* src, uint8_t* dst) {
  __m512i u[4][4];
  for (int64_t g = 0; g < 4; ++g) {
    const auto row = [&](int64_t i) { return _mm512_load_si512(src + (4 * g + i) * kTileCols); };
    const __m512i a = row(0), b = row(1), c = row(2), d = row(3);
    const __m512i ab_lo = _mm512_unpacklo_epi32(a, b), ab_hi = _mm512_unpackhi_epi32(a, b);
    const __m512i cd_lo = _mm512_unpacklo_epi32(c, d), cd_hi = _mm512_unpackhi_epi32(c, d);
    // u[g][m], 128-bit chunk q: column 4q + m of rows 4g..4g+3.
    u[g][0] = _mm512_unpacklo_epi64(ab_lo, cd_lo);
    u[g][1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);
    u[g][2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
    u[g][3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i v02 = _mm512_shuffle_i32x4(u[0][m], u[1][m], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i v13 = _mm512_shuffle_i32x4(u[0][m], u[1][m], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i w02 = _mm512_shuffle_i32x4(u[2][m], u[3][m], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i w13 = _mm512_shuffle_i32x4(u[2][m], u[3][m], _MM_SHUFFLE(3, 1, 3, 1));
    const auto store = [&](int64_t j, __m512i v) { _mm512_store_si512(dst + j * 4 * kR, v); };
    store(m, _mm512_shuffle_i32x4(v02, w02, _MM_SHUFFLE(2, 0, 2, 0)));
    store(8 + m, _mm512_shuffle_i32x4(v02, w02, _MM_SHUFFLE(3, 1, 3, 1)));
    store(4 + m, _mm512_shuffle_i32x4(v13, w13, _MM_SHUFFLE(2, 0, 2, 0)));
    store(12 + m, _mm512_shuffle_i32x4(v13, w13, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

void unpack_panel(const PackedWeight& w, int64_t panel, int group_size, UnpackRowFn unpack,
                  const UnpackedPanel& out) {
  const int64_t kp = w.padded_cols();
  const int valid = static_cast<int>(std::min<int64_t>(kR, w.rows() - panel * kR));
  if (valid < kR) {
    // Rows past the weight's end multiply as zeros (their outputs are masked off anyway).
    std::memset(out.quants, 0, static_cast<size_t>(kp * kR));
    std::memset(out.scale, 0, static_cast<size_t>(kp / group_size * kR) * sizeof(float));
    std::memset(out.offset, 0, static_cast<size_t>(kp / group_size * kR) * sizeof(float));
  }
  // 256 columns at a time: each row unpacked into a row-major tile (the unpackers' natural
  // order), then 16 x 16 int32 transposes put 4 columns of the 16 rows in each vector.
  // Zeroed: rows past the weight's end, and a legacy row's columns past its last 32 in the last
  // run, go through the transposes too (into panel bytes the tile never reads).
  alignas(64) RowTile tile = {};
  for (int64_t k0 = 0; k0 < kp; k0 += kTileCols) {
    const int64_t k1 = std::min<int64_t>(kp, k0 + kTileCols);
    for (int r = 0; r < valid; ++r) {
      unpack(w.panel(panel) + r * w.row_bytes(), k0, k1, r, tile[r], out);
    }
    for (int64_t c = 0; c < k1 - k0; c += 64) {
      transpose_into_panel(&tile[0][c], out.quants + (k0 + c) / 4 * (4 * kR));
    }
  }
}

// An x16-interleaved legacy panel (legacy_x16.h) already has the unpacked panel's lane order:
// each column run is one masked-nibble vector. Rows past the weight's end are stored as zeros
// (d = 0), so they need no clearing.
template <typename Block>
void unpack_x16_panel(const PackedWeight& w, int64_t panel, const UnpackedPanel& out) {
  using L = LegacyX16<Block>;
  const auto* g = reinterpret_cast<const uint8_t*>(w.panel(panel));
  const __m512i levels = L::kNonLinear ? iq4nl_unsigned_levels() : _mm512_setzero_si512();
  for (int64_t b = 0; b < w.padded_cols() / 32; ++b, g += L::kGroupBytes) {
    __m512i u[8];
    unpack_x16_group<Block>(g, levels, u);
    for (int j = 0; j < 8; ++j)
      _mm512_storeu_si512(out.quants + (b * 8 + j) * (4 * kR), u[j]);
    _mm512_storeu_ps(out.scale + b * kR, load_x16_f16s(g + L::kDOffset));
    _mm512_storeu_ps(out.offset + b * kR,
                     L::kHasMin ? load_x16_f16s(g + L::kMOffset) : _mm512_setzero_ps());
  }
}

// An x16-interleaved K-quant panel (kquant_x16.h): its quant vectors are the unpacked panel's,
// and the scales are decoded for the 16 rows at once.
template <typename Block>
void unpack_kquant_x16_panel(const PackedWeight& w, int64_t panel, const UnpackedPanel& out) {
  constexpr KQuantX16Layout kL = kquant_x16_layout_of<Block>();
  constexpr bool kK4 = std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K>;
  const auto* g = reinterpret_cast<const uint8_t*>(w.panel(panel));
  const auto store_run = [&](int64_t b, int64_t run, __m512i u) {
    _mm512_storeu_si512(out.quants + (64 * b + run) * (4 * kR), u);
  };
  for (int64_t b = 0; b < w.padded_cols() / kQKBlockSize; ++b, g += kL.group_bytes) {
    const __m512 d = load_f16x16(g + kL.d);
    if constexpr (kK4) {
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t j = 0; j < 8; ++j) {
          __m512i lo;
          __m512i hi;
          unpack_k4_run<Block>(g, c, j, &lo, &hi);
          store_run(b, 16 * c + j, lo);
          store_run(b, 16 * c + 8 + j, hi);
        }
      }
      K4ScalesX16 s;
      decode_k4_scales_x16(g + kL.scales, &s);
      const __m512 neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), load_f16x16(g + kL.dmin));
      for (int64_t i = 0; i < 8; ++i) {
        const __m512 sc = _mm512_cvtepi32_ps(widen_u8x16(s.scale + 16 * i));
        const __m512 m = _mm512_cvtepi32_ps(widen_u8x16(s.min + 16 * i));
        _mm512_storeu_ps(out.scale + (8 * b + i) * kR, _mm512_mul_ps(d, sc));
        _mm512_storeu_ps(out.offset + (8 * b + i) * kR, _mm512_mul_ps(neg_dmin, m));
      }
    } else {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t j = 0; j < 8; ++j) {
          __m512i u[4];
          unpack_g16_run<Block>(g, h, j, u);
          for (int64_t k = 0; k < 4; ++k) {
            store_run(b, 32 * h + 8 * k + j, u[k]);
          }
        }
      }
      const G16ScalesX16<Block> s(g);
      const auto store_group = [&](int64_t i, __m512i sc, __m512 offset) {
        _mm512_storeu_ps(out.scale + (16 * b + i) * kR, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        _mm512_storeu_ps(out.offset + (16 * b + i) * kR, offset);
      };
      if constexpr (std::is_same_v<Block, BlockQ2_K>) {
        // Loaded once: the stores to `out` may alias `g`, so the compiler cannot hoist it.
        const __m512 neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), load_f16x16(g + kL.dmin));
        for (int64_t i = 0; i < 16; ++i) {
          __m512i sc;
          __m512i m;
          s.scale_and_min(i, &sc, &m);
          store_group(i, sc, _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(m)));
        }
      } else {
        for (int64_t i = 0; i < 16; ++i) {
          store_group(i, s.scale(i), _mm512_setzero_ps());
        }
      }
    }
  }
}

using UnpackX16PanelFn = void (*)(const PackedWeight& w, int64_t panel, const UnpackedPanel& out);

// P panels x T tokens over the whole K: int32 group dots, scaled and offset per group into an
// f32 sum per activation block (A values), which its activation scale then adds to the total.
template <int S, int A, int kBias, bool kHasMin, int P, int T>
requires(kHasMin == (kBias == 0)) void gemm_tile(const MatmulArgs& a, const UnpackedPanel* pan,
                                                 int64_t panel0, int64_t t0) {
  constexpr int kGroupsPerBlock = A / S;
  const int64_t kp = a.w->padded_cols();
  const int64_t groups = kp / S;
  const int64_t rows = a.w->rows();
  const int8_t* xq[T];
  const float* dx[T];
  const int32_t* start[T];  // -kBias * sum of the group's quants (types with a bias)
  const float* xs[T];       // that sum (types with a min)
  __m512 acc[P][T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xq[t] = a.xq + (t0 + t) * kp;
    dx[t] = a.x_block_scale + (t0 + t) * (kp / A);
    if constexpr (kBias != 0) {
      start[t] = a.x_group_start + (t0 + t) * groups;
    } else {
      xs[t] = a.x_group_sum + (t0 + t) * groups;
    }
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
      acc[i][t] = _mm512_setzero_ps();
    }
  }
  for (int64_t blk = 0; blk < kp / A; ++blk) {
    __m512 bsum[P][T];
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        bsum[i][t] = _mm512_setzero_ps();
      }
    }
    for (int64_t g = blk * kGroupsPerBlock; g < (blk + 1) * kGroupsPerBlock; ++g) {
      __m512i dot[P][T];
      // The quants are stored as u = q + kBias: starting at -kBias * sum(x) leaves sum(q * x).
      // The start is read from memory (a load port) rather than computed and broadcast from a
      // general register (a slot on the ports the vpdpbusd use).
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
#pragma GCC unroll 2
        for (int i = 0; i < P; ++i) {
          dot[i][t] = kBias != 0 ? _mm512_set1_epi32(start[t][g]) : _mm512_setzero_si512();
        }
      }
#pragma GCC unroll 8
      for (int k = 0; k < S / 4; ++k) {
        __m512i wv[P];
#pragma GCC unroll 2
        for (int i = 0; i < P; ++i) {
          wv[i] = _mm512_load_si512(pan[i].quants + (g * S / 4 + k) * (4 * kR));
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          int32_t x4;
          std::memcpy(&x4, xq[t] + g * S + k * 4, 4);
          const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 2
          for (int i = 0; i < P; ++i) {
            dot[i][t] = _mm512_dpbusd_epi32(dot[i][t], wv[i], xb);
          }
        }
      }
#pragma GCC unroll 2
      for (int i = 0; i < P; ++i) {
        const __m512 sc = _mm512_load_ps(pan[i].scale + g * kR);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          bsum[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][t]), sc, bsum[i][t]);
        }
        if constexpr (kHasMin) {
          const __m512 off = _mm512_load_ps(pan[i].offset + g * kR);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            bsum[i][t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t][g]), off, bsum[i][t]);
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[i][t] = _mm512_fmadd_ps(bsum[i][t], _mm512_set1_ps(dx[t][blk]), acc[i][t]);
      }
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
    const int n = static_cast<int>(std::min<int64_t>(kR, rows - r0));
    const auto m = static_cast<__mmask16>((1u << n) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(m, a.bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, m, _mm512_add_ps(acc[i][t], bias));
    }
  }
}

// Tokens per tile: with one weight group per activation block (the legacy types) the group sums
// need no registers of their own, which leaves room for 6 tokens: 12 independent vpdpbusd chains
// per k-step, enough to cover its latency (8 were not). The K-quants keep their per-block sums
// in registers and fit 4.
template <int S, int A>
constexpr int kTileTokensOf = S == A ? 6 : 4;

template <int S, int A, int kBias, bool kHasMin, int P, int T>
void gemm_tail(const MatmulArgs& a, const UnpackedPanel* pan, int64_t panel0, int64_t t0,
               int64_t n) {
  if constexpr (T > 0) {
    if (n == T) {
      gemm_tile<S, A, kBias, kHasMin, P, T>(a, pan, panel0, t0);
    } else {
      gemm_tail<S, A, kBias, kHasMin, P, T - 1>(a, pan, panel0, t0, n);
    }
  }
}

template <int S, int A, int kBias, bool kHasMin, int P>
void gemm_tokens(const MatmulArgs& a, const UnpackedPanel* pan, int64_t panel0) {
  constexpr int kT = kTileTokensOf<S, A>;
  int64_t t0 = 0;
  for (; t0 + kT <= a.num_tokens; t0 += kT) {
    gemm_tile<S, A, kBias, kHasMin, P, kT>(a, pan, panel0, t0);
  }
  gemm_tail<S, A, kBias, kHasMin, P, kT - 1>(a, pan, panel0, t0, a.num_tokens - t0);
}

// S values per weight scale group, A per activation block; unpack_one(p, out) unpacks panel p.
template <int S, int A, int kBias, bool kHasMin, typename Unpack>
void gemm_unpacked(const MatmulArgs& a, int64_t pb, int64_t pe, const Unpack& unpack_one) {
  thread_local Scratch scratch;
  scratch.reserve(a.w->padded_cols(), S);
  const UnpackedPanel pan[2] = {scratch.panel(0), scratch.panel(1)};
  for (int64_t p = pb; p < pe; p += 2) {
    const bool two = p + 1 < pe;
    unpack_one(p, pan[0]);
    if (two) {
      unpack_one(p + 1, pan[1]);
      gemm_tokens<S, A, kBias, kHasMin, 2>(a, pan, p);
    } else {
      gemm_tokens<S, A, kBias, kHasMin, 1>(a, pan, p);
    }
  }
}

// The ggml types' panels: unpack_x16 for x16 weights (null for the types without an x16 layout).
template <int S, int A, int kBias, bool kHasMin>
void gemm_panels(const MatmulArgs& a, int64_t pb, int64_t pe, UnpackRowFn unpack,
                 UnpackX16PanelFn unpack_x16 = nullptr) {
  gemm_unpacked<S, A, kBias, kHasMin>(a, pb, pe, [&](int64_t p, const UnpackedPanel& out) {
    if (a.w->is_x16()) {
      CRESCENT_CHECK(unpack_x16 != nullptr);
      unpack_x16(*a.w, p, out);
    } else {
      unpack_panel(*a.w, p, S, unpack, out);
    }
  });
}

// A Q8_0 panel (kernel_table.h's layout) holds its quants as the unpacked panel does (u8 = q +
// 128, 512 bytes a block in vpdpbusd's order), but in block pairs behind their f16 scales: the
// blocks are copied out of their pairs and the scales widened. (The tile could read them in
// place with a stride per block pair; the copy is one pass over the weight per matmul, which
// kQ8GemmMinTokens tokens of work repay.)
void unpack_q8_0_panel(const PackedWeight& w, int64_t panel, const UnpackedPanel& out) {
  const std::byte* p = w.panel(panel);
  for (int64_t b = 0; b < w.padded_cols() / 32; ++b) {
    std::memcpy(out.quants + b * kQ8BlockQuantBytes, p + q8_quants_offset(b), kQ8BlockQuantBytes);
    const __m256i scales =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(p + q8_scales_offset(b)));
    _mm512_storeu_ps(out.scale + b * kR, _mm512_cvtph_ps(scales));
  }
}

void gemm_q8_0(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.w->format() == WeightFormat::kQ8_0 && a.group_size == 32);
  gemm_unpacked<32, 32, 128, false>(
      a, pb, pe, [&](int64_t p, const UnpackedPanel& out) { unpack_q8_0_panel(*a.w, p, out); });
}

// The biases below are the ones prepare_group_acts (matmul.cc) folds into x_group_start.
static_assert(ggml_gemm_bias(DType::kQ4_0) == 8 && ggml_gemm_bias(DType::kQ5_0) == 16 &&
              ggml_gemm_bias(DType::kQ3_K) == 4 && ggml_gemm_bias(DType::kQ6_K) == 32 &&
              ggml_gemm_bias(DType::kIQ4_NL) == 128 && ggml_gemm_bias(DType::kQ8_0) == 128 &&
              ggml_gemm_group_size(DType::kQ8_0) == 32);

void gemm_ggml(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.group_size == ggml_gemm_group_size(*ggml_row_dtype(a.w->format())));
  switch (*ggml_row_dtype(a.w->format())) {
    case DType::kQ4_0:
      return gemm_panels<32, 32, 8, false>(a, pb, pe, unpack_row<BlockQ4_0, 8, false>,
                                           unpack_x16_panel<BlockQ4_0>);
    case DType::kQ4_1:
      return gemm_panels<32, 32, 0, true>(a, pb, pe, unpack_row<BlockQ4_1, 0, false>,
                                          unpack_x16_panel<BlockQ4_1>);
    case DType::kQ5_0:
      return gemm_panels<32, 32, 16, false>(a, pb, pe, unpack_row<BlockQ5_0, 16, false>,
                                            unpack_x16_panel<BlockQ5_0>);
    case DType::kQ5_1:
      return gemm_panels<32, 32, 0, true>(a, pb, pe, unpack_row<BlockQ5_1, 0, false>,
                                          unpack_x16_panel<BlockQ5_1>);
    case DType::kQ2_K:
      return gemm_panels<16, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ2_K, 0, true>,
                                                    unpack_kquant_x16_panel<BlockQ2_K>);
    case DType::kQ3_K:
      return gemm_panels<16, kQKBlockSize, 4, false>(a, pb, pe, unpack_row<BlockQ3_K, 4, true>,
                                                     unpack_kquant_x16_panel<BlockQ3_K>);
    case DType::kQ4_K:
      return gemm_panels<32, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ4_K, 0, true>,
                                                    unpack_kquant_x16_panel<BlockQ4_K>);
    case DType::kQ5_K:
      return gemm_panels<32, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ5_K, 0, true>,
                                                    unpack_kquant_x16_panel<BlockQ5_K>);
    case DType::kQ6_K:
      return gemm_panels<16, kQKBlockSize, 32, false>(a, pb, pe, unpack_row<BlockQ6_K, 32, true>,
                                                      unpack_kquant_x16_panel<BlockQ6_K>);
    case DType::kIQ4_NL:
      return gemm_panels<32, 32, 128, false>(a, pb, pe, unpack_row<BlockIQ4_NL, 128, false>,
                                             unpack_x16_panel<BlockIQ4_NL>);
    default:
      CRESCENT_CHECK(false) << "no ggml GEMM for " << weight_format_name(a.w->format());
  }
}

// Register-only vpdpbusd loop for the int8 peak baseline.
double peak_int8_ops(int64_t num_iters) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int j = 0; j < kChains; ++j) {
    acc[j] = _mm512_set1_epi32(j);
  }
  const __m512i u = _mm512_set1_epi8(1);
  const __m512i s = _mm512_set1_epi8(2);
  for (int64_t i = 0; i < num_iters; ++i) {
#pragma GCC unroll 12
    for (__m512i& chain : acc) {
      chain = _mm512_dpbusd_epi32(chain, u, s);
    }
  }
  __m512i sum = acc[0];
  for (int j = 1; j < kChains; ++j) {
    sum = _mm512_add_epi32(sum, acc[j]);
  }
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  // 16 lanes x 4 products, 2 ops per multiply-add.
  return 2.0 * 64 * kChains * static_cast<double>(num_iters);
}

}  // namespace

void fill_gemm_ggml_avx512vnni(KernelTable* t) {
  t->gemm_ggml = gemm_ggml;
  t->gemm_q8 = gemm_q8_0;
  t->peak_int8_ops = peak_int8_ops;
}

}  // namespace crescent::kernels::internal
