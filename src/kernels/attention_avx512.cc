// Prefill attention on AVX-512 (attend_rows, kernel_table.h): flash attention with the
// queries in the vector lanes. A task's query rows (its tokens x the KV head's query heads) go
// 16 to a lane group, transposed once into qt[d][lane] with the score scale folded in; the
// output accumulates transposed in ot[d][lane] and is written back once at the end. Per chunk of
// 16 keys, K and V (bf16 or f16) are widened to f32 once for every group, then for each pair
// of groups:
//  - scores: s[key][lane] += qt[d][lane] * k[key][d], a register tile of 8 keys x 2 groups
//    (16 accumulators; per dimension 2 vector loads and 8 broadcasts feed 16 FMAs);
//  - online softmax, lane-wise: the running max, the rescale factor and the sum are plain
//    vertical ops over the 16 score vectors (no horizontal reductions, which made the per-query
//    loop this replaces latency-bound at ~0.2 of the FMA peak);
//  - values: ot[d][lane] += p[key][lane] * v[key][d], 8 dimensions x 2 groups per tile, each FMA
//    masked to the lanes that see the key, so a key a query may not see adds nothing (not 0 * V,
//    which is NaN where V is not finite).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/avx512_math.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int64_t kLanes = 16;  // query rows per lane group
constexpr int64_t kKeys = 16;   // keys per online-softmax step

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One thread's buffers for a task of `groups` lane groups, grown to the largest task seen.
class Scratch {
 public:
  void reserve(int groups, int64_t dim) {
    const int64_t vec_bytes = kLanes * static_cast<int64_t>(sizeof(float));
    const int64_t bytes = groups * vec_bytes * (2 * dim + kKeys + 3);
    if (bytes > capacity_) {
      capacity_ = bytes;
      void* p = std::aligned_alloc(64, static_cast<size_t>(bytes));
      CRESCENT_CHECK(p != nullptr) << "out of memory for the attention scratch";
      buffer_.reset(static_cast<std::byte*>(p));
    }
    auto* f = reinterpret_cast<float*>(buffer_.get());
    const int64_t per_group = dim * kLanes;
    qt = f;
    ot = qt + groups * per_group;
    p = ot + groups * per_group;
    m = p + int64_t{groups} * kKeys * kLanes;
    l = m + int64_t{groups} * kLanes;
    visible = reinterpret_cast<int32_t*>(l + int64_t{groups} * kLanes);
  }
  float* qt = nullptr;         // [group][d][lane], scaled queries
  float* ot = nullptr;         // [group][d][lane], unnormalised outputs
  float* p = nullptr;          // [group][key][lane], the chunk's scores, then their weights
  float* m = nullptr;          // [group][lane], running max score
  float* l = nullptr;          // [group][lane], running sum of weights
  int32_t* visible = nullptr;  // [group][lane], keys each row sees (0 for padding lanes)

 private:
  std::unique_ptr<std::byte, FreeDeleter> buffer_;
  int64_t capacity_ = 0;
};

// s[g][key][lane] = sum over d of qt[g][d][lane] * kf[key][d], for the NG groups and 16 keys.
template <int NG>
inline void chunk_scores(const float* const* qt, const float* kf, int64_t dim, float* const* s) {
  constexpr int64_t kPass = kKeys / NG;  // 8 keys x 2 groups or 16 keys x 1: 16 accumulators
  for (int j0 = 0; j0 < kKeys; j0 += kPass) {
    __m512 acc[kPass][NG];
#pragma GCC unroll 16
    for (int j = 0; j < kPass; ++j) {
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        acc[j][g] = _mm512_setzero_ps();
      }
    }
    for (int64_t d = 0; d < dim; ++d) {
      __m512 q[NG];
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        q[g] = _mm512_load_ps(qt[g] + d * kLanes);
      }
#pragma GCC unroll 16
      for (int j = 0; j < kPass; ++j) {
        const __m512 k = _mm512_set1_ps(kf[(j0 + j) * dim + d]);
#pragma GCC unroll 2
        for (int g = 0; g < NG; ++g) {
          acc[j][g] = _mm512_fmadd_ps(q[g], k, acc[j][g]);
        }
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < kPass; ++j) {
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        _mm512_store_ps(s[g] + (j0 + j) * kLanes, acc[j][g]);
      }
    }
  }
}

// One group's online-softmax step over the chunk's keys [j0, j0 + 16): turns its scores in p
// into weights exp(score - max) (0 in the lanes that do not see the key), sets mask[key] to the
// lanes that see it, updates the running max m and sum l, and leaves in *corr the factor the
// output must be rescaled by. Returns whether any lane's max grew (else *corr is all ones).
inline bool softmax_step(float* p, float* m, float* l, const int32_t* visible, int64_t j0,
                         __mmask16* mask, __m512* corr) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i vis = _mm512_load_si512(visible);
  __m512 chunk_max = neg_inf;
  for (int j = 0; j < kKeys; ++j) {
    mask[j] = _mm512_cmpgt_epi32_mask(vis, _mm512_set1_epi32(static_cast<int32_t>(j0 + j)));
    chunk_max = _mm512_max_ps(chunk_max,
                              _mm512_mask_mov_ps(neg_inf, mask[j], _mm512_load_ps(p + j * kLanes)));
  }
  const __m512 old_max = _mm512_load_ps(m);
  const __m512 new_max = _mm512_max_ps(old_max, chunk_max);
  const __mmask16 grew = _mm512_cmp_ps_mask(new_max, old_max, _CMP_GT_OQ);
  // Lanes that have seen no key yet keep max -inf; subtract 0 there instead (their weights are
  // masked to 0 anyway, and -inf - -inf would be NaN).
  const __m512 base = _mm512_mask_mov_ps(new_max, _mm512_cmp_ps_mask(new_max, neg_inf, _CMP_EQ_OQ),
                                         _mm512_setzero_ps());
  *corr = exp_ps(_mm512_sub_ps(old_max, base));  // exactly 1 where the max did not grow
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < kKeys; ++j) {
    const __m512 e =
        _mm512_maskz_mov_ps(mask[j], exp_ps(_mm512_sub_ps(_mm512_load_ps(p + j * kLanes), base)));
    _mm512_store_ps(p + j * kLanes, e);
    sum = _mm512_add_ps(sum, e);
  }
  _mm512_store_ps(l, _mm512_fmadd_ps(_mm512_load_ps(l), *corr, sum));
  _mm512_store_ps(m, new_max);
  return grew != 0;
}

// ot[g][d][lane] (first multiplied by corr[g] when rescale) += sum over the chunk's nk keys of
// p[g][key][lane] * vf[key][d], each key only in the lanes of mask[g][key]. kFull: all 16 keys
// in every lane (the chunks below a task's diagonal; a fixed trip count and no masks).
template <int NG, bool kFull>
inline void chunk_values(float* const* ot, const float* const* p, const __mmask16* const* mask,
                         const __m512* corr, bool rescale, const float* vf, int64_t dim,
                         int num_keys) {
  constexpr int kDims = 16 / NG;  // 8 dimensions x 2 groups or 16 x 1: 16 accumulators
  const int nk = kFull ? static_cast<int>(kKeys) : num_keys;
  for (int64_t d0 = 0; d0 < dim; d0 += kDims) {
    __m512 acc[kDims][NG];
#pragma GCC unroll 16
    for (int i = 0; i < kDims; ++i) {
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        acc[i][g] = _mm512_load_ps(ot[g] + (d0 + i) * kLanes);
        if (rescale) {
          acc[i][g] = _mm512_mul_ps(acc[i][g], corr[g]);
        }
      }
    }
    for (int j = 0; j < nk; ++j) {
      __m512 pj[NG];
      __mmask16 mj[NG];
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        pj[g] = _mm512_load_ps(p[g] + j * kLanes);
        mj[g] = kFull ? __mmask16{0xffff} : mask[g][j];
      }
#pragma GCC unroll 16
      for (int i = 0; i < kDims; ++i) {
        const __m512 v = _mm512_set1_ps(vf[j * dim + d0 + i]);
#pragma GCC unroll 2
        for (int g = 0; g < NG; ++g) {
          acc[i][g] = kFull ? _mm512_fmadd_ps(pj[g], v, acc[i][g])
                            : _mm512_mask3_fmadd_ps(pj[g], v, acc[i][g], mj[g]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kDims; ++i) {
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        _mm512_store_ps(ot[g] + (d0 + i) * kLanes, acc[i][g]);
      }
    }
  }
}

// Scores, softmax step and values of groups g[0..NG) over one chunk (full: every row of the
// groups sees all 16 keys).
template <int NG>
void chunk_groups(Scratch& sc, const int* g, const float* kf, const float* vf, int64_t dim,
                  int64_t j0, int nk, bool full, __mmask16 (*masks)[kKeys]) {
  const float* qt[NG];
  float* ot[NG];
  float* p[NG];
  const __mmask16* mask[NG];
  __m512 corr[NG];
  bool rescale = false;
  for (int i = 0; i < NG; ++i) {
    qt[i] = sc.qt + g[i] * dim * kLanes;
    ot[i] = sc.ot + g[i] * dim * kLanes;
    p[i] = sc.p + g[i] * kKeys * kLanes;
    mask[i] = masks[i];
  }
  chunk_scores<NG>(qt, kf, dim, p);
  for (int i = 0; i < NG; ++i) {
    rescale |= softmax_step(p[i], sc.m + g[i] * kLanes, sc.l + g[i] * kLanes,
                            sc.visible + g[i] * kLanes, j0, masks[i], &corr[i]);
  }
  if (full) {
    chunk_values<NG, true>(ot, p, mask, corr, rescale, vf, dim, nk);
  } else {
    chunk_values<NG, false>(ot, p, mask, corr, rescale, vf, dim, nk);
  }
}

// Keys [j0, j0 + nk) widened to f32 rows of `dim` (rows nk..15 of kf zeroed: their scores are
// masked off, but must not be NaN).
void widen_chunk(const AttendRowsArgs& a, int64_t j0, int nk, float* kf, float* vf) {
  for (int j = 0; j < kKeys; ++j) {
    if (j >= nk) {
      std::fill(kf + j * a.dim, kf + (j + 1) * a.dim, 0.0f);
      continue;
    }
    const int64_t key = j0 + j;
    const int64_t offset = key % a.block_size * a.stride;
    const uint16_t* k = a.k_blocks[key / a.block_size] + offset;
    const uint16_t* v = a.v_blocks[key / a.block_size] + offset;
    for (int64_t d = 0; d < a.dim; d += 16) {
      const auto widen = [&](const uint16_t* src) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        return a.f16 ? _mm512_cvtph_ps(h)
                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      };
      _mm512_store_ps(kf + j * a.dim + d, widen(k + d));
      _mm512_store_ps(vf + j * a.dim + d, widen(v + d));
    }
  }
}

void attend_rows(const AttendRowsArgs& a) {
  CRESCENT_CHECK(a.dim % 16 == 0 && a.dim <= kMaxTileDim && a.num_q >= 1)
      << "attend_rows: head dim " << a.dim << ", " << a.num_q << " rows";
  const int64_t dim = a.dim;
  const int groups = static_cast<int>((a.num_q + kLanes - 1) / kLanes);
  thread_local Scratch sc;
  sc.reserve(groups, dim);
  std::fill(sc.ot, sc.ot + groups * dim * kLanes, 0.0f);
  std::fill(sc.m, sc.m + groups * kLanes, -std::numeric_limits<float>::infinity());
  std::fill(sc.l, sc.l + groups * kLanes, 0.0f);
  for (int i = 0; i < groups * kLanes; ++i) {
    float* qt = sc.qt + i / kLanes * dim * kLanes + i % kLanes;
    const bool row = i < a.num_q;
    sc.visible[i] = row ? static_cast<int32_t>(std::min<int64_t>(a.visible[i], a.num_keys)) : 0;
    for (int64_t d = 0; d < dim; ++d) {
      qt[d * kLanes] = row ? a.q[i][d] * a.scale : 0.0f;
    }
  }
  // Per group, the fewest and the most keys one of its rows sees (padding lanes count as 0).
  thread_local std::vector<int32_t> fewest;
  thread_local std::vector<int32_t> most;
  fewest.resize(groups);
  most.resize(groups);
  for (int g = 0; g < groups; ++g) {
    const int32_t* vis = sc.visible + g * kLanes;
    fewest[g] = *std::min_element(vis, vis + kLanes);
    most[g] = *std::max_element(vis, vis + kLanes);
  }
  alignas(64) float kf[kKeys * kMaxTileDim];
  alignas(64) float vf[kKeys * kMaxTileDim];
  __mmask16 masks[2][kKeys];
  int live[2];
  for (int64_t j0 = 0; j0 < a.num_keys; j0 += kKeys) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, a.num_keys - j0));
    widen_chunk(a, j0, nk, kf, vf);
    const auto sees_all = [&](int g) { return fewest[g] >= j0 + kKeys; };
    int num_live = 0;
    for (int g = 0; g < groups; ++g) {
      if (most[g] <= j0) {
        continue;  // none of its rows sees a key of the chunk
      }
      live[num_live++] = g;
      if (num_live == 2) {
        chunk_groups<2>(sc, live, kf, vf, dim, j0, nk, sees_all(live[0]) && sees_all(live[1]),
                        masks);
        num_live = 0;
      }
    }
    if (num_live == 1) {
      chunk_groups<1>(sc, live, kf, vf, dim, j0, nk, sees_all(live[0]), masks);
    }
  }
  for (int i = 0; i < a.num_q; ++i) {
    const float* ot = sc.ot + i / kLanes * dim * kLanes + i % kLanes;
    const float inv = 1.0f / sc.l[i];
    for (int64_t d = 0; d < dim; ++d) {
      a.out[i][d] = ot[d * kLanes] * inv;
    }
  }
}

}  // namespace

void fill_attention_avx512(KernelTable* t) {
  t->attend_rows = attend_rows;
}

}  // namespace crescent::kernels::internal
