// AVX512-VNNI GEMM for the ggml block types (Q4_0 ... Q6_K) when many tokens share a weight
// (prefill). The row dots (quant_dot_*.cc) unpack every weight block again for each group of
// kMaxDotTokens tokens; here each pair of 16-row panels is unpacked once per matmul into a
// per-thread scratch that stays in L2 — u8 quants laid out as vpdpbusd wants them (4 values of
// one row per int32 lane, 16 rows per vector) plus an f32 scale and offset per row and group —
// and then every token runs against it in a 2-panel x 4-token register tile.
//
// Why not repack at load: the unpacked form is ~2.5x the bytes of Q4_K, and batch-1 decode,
// which is bound by reading those bytes, keeps the row dots on the stored blocks. Unpacking per
// matmul costs about one pass over the weight, small next to 16+ tokens of multiply-adds.
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

#include "core/check.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_unpack.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = kPanelRows;
constexpr int kTileTokens = 4;

// One 16-row panel unpacked: quants[k / 4][row][k % 4] (k < padded cols), scale and offset
// [group][row].
struct UnpackedPanel {
  uint8_t* quants = nullptr;
  float* scale = nullptr;
  float* offset = nullptr;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Per-thread scratch for two panels, grown to the largest weight seen.
class Scratch {
 public:
  void reserve(int64_t padded_cols, int group_size) {
    const int64_t quant_bytes = padded_cols * kR;
    const int64_t param_bytes = padded_cols / group_size * kR * static_cast<int64_t>(sizeof(float));
    const int64_t panel_bytes = quant_bytes + 2 * param_bytes;
    if (2 * panel_bytes > capacity_) {
      capacity_ = 2 * panel_bytes;
      void* p = std::aligned_alloc(64, static_cast<size_t>((capacity_ + 63) / 64 * 64));
      CRESCENT_CHECK(p != nullptr) << "out of memory for the GEMM scratch";
      buffer_.reset(static_cast<std::byte*>(p));
    }
    for (int i = 0; i < 2; ++i) {
      std::byte* base = buffer_.get() + i * panel_bytes;
      panels_[i].quants = reinterpret_cast<uint8_t*>(base);
      panels_[i].scale = reinterpret_cast<float*>(base + quant_bytes);
      panels_[i].offset = reinterpret_cast<float*>(base + quant_bytes + param_bytes);
    }
  }
  const UnpackedPanel& panel(int i) const { return panels_[i]; }

 private:
  std::unique_ptr<std::byte, FreeDeleter> buffer_;
  int64_t capacity_ = 0;
  UnpackedPanel panels_[2];
};

// Writes the 4-value runs of one row's `n` u8 quants (k0 = the first column) into the panel.
inline void store_row_quants(const uint8_t* u, int n, int64_t k0, int row, uint8_t* quants) {
  for (int k = 0; k < n; k += 4)
    std::memcpy(quants + (k0 + k) / 4 * (4 * kR) + row * 4, u + k, 4);
}

// The legacy types (32 values per block, one group): w = d * q + m with q signed for Q4_0 / Q5_0
// (bias 8 / 16 makes it unsigned).
template <typename Block, int kBias>
void unpack_legacy_row(const Block* blocks, int64_t num_blocks, int row, const UnpackedPanel& out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    int8_t q[32];
    const LegacyScale s = unpack_legacy(blocks[b], q);
    uint8_t u[32];
    for (int i = 0; i < 32; ++i)
      u[i] = static_cast<uint8_t>(q[i] + kBias);
    store_row_quants(u, 32, b * 32, row, out.quants);
    out.scale[b * kR + row] = s.d;
    out.offset[b * kR + row] = s.m;
  }
}

// The K-quants (256 values, 8 groups of 32 or 16 of 16): w = d * scale[g] * q - dmin * min[g],
// q signed for Q6_K / Q3_K (bias 32 / 4).
template <typename Block, int kBias>
void unpack_k_row(const Block* blocks, int64_t num_blocks, int row, const UnpackedPanel& out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    int8_t q[kQKBlockSize];
    KScales s;
    unpack_k(blocks[b], q, &s);
    uint8_t u[kQKBlockSize];
    for (int i = 0; i < kQKBlockSize; ++i)
      u[i] = static_cast<uint8_t>(q[i] + kBias);
    store_row_quants(u, kQKBlockSize, b * kQKBlockSize, row, out.quants);
    for (int g = 0; g < s.num_groups; ++g) {
      const int64_t gi = (b * s.num_groups + g) * kR + row;
      const float scale = s.d * static_cast<float>(s.scale[g]);
      out.scale[gi] = scale;
      out.offset[gi] = -s.dmin * static_cast<float>(s.min[g]);
    }
  }
}

using UnpackRowFn = void (*)(const void* row, int64_t padded_cols, int r, const UnpackedPanel&);

template <typename Block, int kBias, bool kK>
void unpack_row(const void* row, int64_t padded_cols, int r, const UnpackedPanel& out) {
  const auto* blocks = static_cast<const Block*>(row);
  if constexpr (kK) {
    unpack_k_row<Block, kBias>(blocks, padded_cols / kQKBlockSize, r, out);
  } else {
    unpack_legacy_row<Block, kBias>(blocks, padded_cols / 32, r, out);
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
  for (int r = 0; r < valid; ++r)
    unpack(w.panel(panel) + r * w.row_bytes(), kp, r, out);
}

// P panels x T tokens over the whole K: int32 group dots, scaled and offset per group into an
// f32 sum per activation block (A values), which its activation scale then adds to the total.
template <int S, int A, int kBias, bool kHasMin, int P, int T>
void gemm_tile(const MatmulArgs& a, const UnpackedPanel* pan, int64_t panel0, int64_t t0) {
  constexpr int kGroupsPerBlock = A / S;
  const int64_t kp = a.w->padded_cols();
  const int64_t groups = kp / S;
  const int64_t rows = a.w->rows();
  const int8_t* xq[T];
  const float* dx[T];
  const int32_t* xs[T];
  __m512 acc[P][T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    xq[t] = a.xq + (t0 + t) * kp;
    dx[t] = a.x_block_scale + (t0 + t) * (kp / A);
    xs[t] = a.x_group_sum + (t0 + t) * groups;
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i)
      acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t blk = 0; blk < kp / A; ++blk) {
    __m512 bsum[P][T];
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        bsum[i][t] = _mm512_setzero_ps();
    }
    for (int64_t g = blk * kGroupsPerBlock; g < (blk + 1) * kGroupsPerBlock; ++g) {
      __m512i dot[P][T];
      // The quants are stored as u = q + kBias: starting at -kBias * sum(x) leaves sum(q * x).
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i start = _mm512_set1_epi32(-kBias * xs[t][g]);
#pragma GCC unroll 2
        for (int i = 0; i < P; ++i)
          dot[i][t] = start;
      }
#pragma GCC unroll 8
      for (int k = 0; k < S / 4; ++k) {
        __m512i wv[P];
#pragma GCC unroll 2
        for (int i = 0; i < P; ++i)
          wv[i] = _mm512_load_si512(pan[i].quants + (g * S / 4 + k) * (4 * kR));
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          int32_t x4;
          std::memcpy(&x4, xq[t] + g * S + k * 4, 4);
          const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 2
          for (int i = 0; i < P; ++i)
            dot[i][t] = _mm512_dpbusd_epi32(dot[i][t], wv[i], xb);
        }
      }
#pragma GCC unroll 2
      for (int i = 0; i < P; ++i) {
        const __m512 sc = _mm512_load_ps(pan[i].scale + g * kR);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t)
          bsum[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][t]), sc, bsum[i][t]);
        if constexpr (kHasMin) {
          const __m512 off = _mm512_load_ps(pan[i].offset + g * kR);
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) {
            bsum[i][t] =
                _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(xs[t][g])), off, bsum[i][t]);
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < P; ++i) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        acc[i][t] = _mm512_fmadd_ps(bsum[i][t], _mm512_set1_ps(dx[t][blk]), acc[i][t]);
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < P; ++i) {
    const int64_t r0 = (panel0 + i) * kR;
    const int n = static_cast<int>(std::min<int64_t>(kR, rows - r0));
    const auto m = static_cast<__mmask16>((1u << n) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(m, a.bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
      _mm512_mask_storeu_ps(a.y + (t0 + t) * rows + r0, m, _mm512_add_ps(acc[i][t], bias));
  }
}

template <int S, int A, int kBias, bool kHasMin, int P>
void gemm_tokens(const MatmulArgs& a, const UnpackedPanel* pan, int64_t panel0) {
  int64_t t0 = 0;
  for (; t0 + kTileTokens <= a.num_tokens; t0 += kTileTokens)
    gemm_tile<S, A, kBias, kHasMin, P, kTileTokens>(a, pan, panel0, t0);
  switch (a.num_tokens - t0) {
    case 3:
      gemm_tile<S, A, kBias, kHasMin, P, 3>(a, pan, panel0, t0);
      break;
    case 2:
      gemm_tile<S, A, kBias, kHasMin, P, 2>(a, pan, panel0, t0);
      break;
    case 1:
      gemm_tile<S, A, kBias, kHasMin, P, 1>(a, pan, panel0, t0);
      break;
    default:
      break;
  }
}

// S values per weight scale group, A per activation block.
template <int S, int A, int kBias, bool kHasMin>
void gemm_panels(const MatmulArgs& a, int64_t pb, int64_t pe, UnpackRowFn unpack) {
  thread_local Scratch scratch;
  scratch.reserve(a.w->padded_cols(), S);
  const UnpackedPanel pan[2] = {scratch.panel(0), scratch.panel(1)};
  for (int64_t p = pb; p < pe; p += 2) {
    const bool two = p + 1 < pe;
    unpack_panel(*a.w, p, S, unpack, pan[0]);
    if (two) {
      unpack_panel(*a.w, p + 1, S, unpack, pan[1]);
      gemm_tokens<S, A, kBias, kHasMin, 2>(a, pan, p);
    } else {
      gemm_tokens<S, A, kBias, kHasMin, 1>(a, pan, p);
    }
  }
}

void gemm_ggml(const MatmulArgs& a, int64_t pb, int64_t pe) {
  CRESCENT_CHECK(a.group_size == ggml_gemm_group_size(*ggml_row_dtype(a.w->format())));
  switch (*ggml_row_dtype(a.w->format())) {
    case DType::kQ4_0:
      return gemm_panels<32, 32, 8, false>(a, pb, pe, unpack_row<BlockQ4_0, 8, false>);
    case DType::kQ4_1:
      return gemm_panels<32, 32, 0, true>(a, pb, pe, unpack_row<BlockQ4_1, 0, false>);
    case DType::kQ5_0:
      return gemm_panels<32, 32, 16, false>(a, pb, pe, unpack_row<BlockQ5_0, 16, false>);
    case DType::kQ5_1:
      return gemm_panels<32, 32, 0, true>(a, pb, pe, unpack_row<BlockQ5_1, 0, false>);
    case DType::kQ2_K:
      return gemm_panels<16, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ2_K, 0, true>);
    case DType::kQ3_K:
      return gemm_panels<16, kQKBlockSize, 4, false>(a, pb, pe, unpack_row<BlockQ3_K, 4, true>);
    case DType::kQ4_K:
      return gemm_panels<32, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ4_K, 0, true>);
    case DType::kQ5_K:
      return gemm_panels<32, kQKBlockSize, 0, true>(a, pb, pe, unpack_row<BlockQ5_K, 0, true>);
    case DType::kQ6_K:
      return gemm_panels<16, kQKBlockSize, 32, false>(a, pb, pe, unpack_row<BlockQ6_K, 32, true>);
    default:
      CRESCENT_CHECK(false) << "no ggml GEMM for " << weight_format_name(a.w->format());
  }
}

// Register-only vpdpbusd loop for the int8 peak baseline.
double peak_int8_ops(int64_t num_iters) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int j = 0; j < kChains; ++j)
    acc[j] = _mm512_set1_epi32(j);
  const __m512i u = _mm512_set1_epi8(1);
  const __m512i s = _mm512_set1_epi8(2);
  for (int64_t i = 0; i < num_iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j)
      acc[j] = _mm512_dpbusd_epi32(acc[j], u, s);
  }
  __m512i sum = acc[0];
  for (int j = 1; j < kChains; ++j)
    sum = _mm512_add_epi32(sum, acc[j]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  // 16 lanes x 4 products, 2 ops per multiply-add.
  return 2.0 * 64 * kChains * static_cast<double>(num_iters);
}

}  // namespace

void fill_gemm_ggml_avx512vnni(KernelTable* t) {
  t->gemm_ggml = gemm_ggml;
  t->peak_int8_ops = peak_int8_ops;
}

}  // namespace crescent::kernels::internal
