#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"

namespace crescent::kernels {
namespace {

constexpr int64_t kQueryChunk = 16;

struct Task {
  int64_t seq;
  int kv_head;
  int64_t t_begin;
  int64_t t_end;
};

// Dot and axpy of an f32 vector with one stored head row of type D, from the kernel table.
template <KvDtype D>
struct KvOps {
  const internal::KernelTable& ops;
  float dot(const float* q, const std::byte* k, int64_t n) const {
    if constexpr (D == KvDtype::kFloat32)
      return ops.dot(q, reinterpret_cast<const float*>(k), n);
    else if constexpr (D == KvDtype::kBf16)
      return ops.dot_bf16(q, reinterpret_cast<const uint16_t*>(k), n);
    else if constexpr (D == KvDtype::kF16)
      return ops.dot_f16(q, reinterpret_cast<const uint16_t*>(k), n);
    else if constexpr (D == KvDtype::kFp8E4m3)
      return ops.dot_fp8(q, reinterpret_cast<const uint8_t*>(k), n);
    else
      return ops.dot_q8_0(q, reinterpret_cast<const Q8Block*>(k), n);
  }
  void axpy(float a, const std::byte* v, float* y, int64_t n) const {
    if constexpr (D == KvDtype::kFloat32)
      ops.axpy(a, reinterpret_cast<const float*>(v), y, n);
    else if constexpr (D == KvDtype::kBf16)
      ops.axpy_bf16(a, reinterpret_cast<const uint16_t*>(v), y, n);
    else if constexpr (D == KvDtype::kF16)
      ops.axpy_f16(a, reinterpret_cast<const uint16_t*>(v), y, n);
    else if constexpr (D == KvDtype::kFp8E4m3)
      ops.axpy_fp8(a, reinterpret_cast<const uint8_t*>(v), y, n);
    else
      ops.axpy_q8_0(a, reinterpret_cast<const Q8Block*>(v), y, n);
  }
  // The same over the n rows of a key block, `row_bytes` apart: out[j] = scale * dot(q, row j);
  // y += sum_j p[j] * row j. The bf16 cache (the default) has one-call forms in the table.
  void dot_block(const float* q, const std::byte* k, int64_t row_bytes, int n, int64_t dim,
                 float scale, float* out) const {
    if constexpr (D == KvDtype::kBf16) {
      ops.dot_rows_bf16(q, reinterpret_cast<const uint16_t*>(k), row_bytes / 2, n, dim, scale, out);
    } else {
      for (int j = 0; j < n; ++j)
        out[j] = dot(q, k + j * row_bytes, dim) * scale;
    }
  }
  void axpy_block(const float* p, const std::byte* v, int64_t row_bytes, int n, int64_t dim,
                  float* y) const {
    if constexpr (D == KvDtype::kBf16) {
      ops.axpy_rows_bf16(p, reinterpret_cast<const uint16_t*>(v), row_bytes / 2, n, dim, y);
    } else {
      for (int j = 0; j < n; ++j)
        axpy(p[j], v + j * row_bytes, y, dim);
    }
  }
};

// Where KV block `block`'s rows of `layer` start for one kv head: K and V.
struct KvHeadRows {
  const std::byte* k;
  const std::byte* v;
};
KvHeadRows kv_head_rows(const KvCacheLayout& layout, const std::byte* block, int layer,
                        int kv_head) {
  const int64_t part = layout.layer_part_bytes();
  const int64_t head = kv_head * layout.head_row_bytes();
  return {block + 2 * layer * part + head, block + (2 * layer + 1) * part + head};
}

// Prefill chunks of at least this many query rows go through attend_rows, which widens
// each chunk of keys once for all of the chunk's rows and heads and runs them in register tiles;
// fewer rows (decode) would not repay the transposes.
constexpr int64_t kTileMinRows = 4;

// One task's rows [t_begin, t_end) x the kv head's query heads, through attend_rows.
void attend_task_in_tiles(const internal::KernelTable& ops, const AttentionSeq& seq, int kv_head,
                          int64_t t_begin, int64_t t_end, const float* q, int num_heads, int group,
                          int layer, const KvCacheLayout& layout, const std::byte* kv_base,
                          float scale, float* out) {
  const int num_q = static_cast<int>((t_end - t_begin) * group);
  const int64_t head_dim = layout.head_dim;
  std::vector<const float*> q_rows(num_q);
  std::vector<float*> out_rows(num_q);
  std::vector<int> visible(num_q);
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int h = 0; h < group; ++h) {
      const int i = static_cast<int>((t - t_begin) * group + h);
      const int64_t offset =
          ((seq.q_row + t) * num_heads + int64_t{kv_head} * group + h) * head_dim;
      q_rows[i] = q + offset;
      out_rows[i] = out + offset;
      visible[i] = static_cast<int>(seq.start_pos + t + 1);
    }
  }
  const int64_t num_keys = seq.start_pos + t_end;
  const int64_t num_blocks = (num_keys + layout.block_size - 1) / layout.block_size;
  std::vector<const uint16_t*> k_blocks(num_blocks);
  std::vector<const uint16_t*> v_blocks(num_blocks);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const KvHeadRows rows = kv_head_rows(
        layout, kv_base + int64_t{seq.block_table[b]} * layout.block_num_bytes(), layer, kv_head);
    k_blocks[b] = reinterpret_cast<const uint16_t*>(rows.k);
    v_blocks[b] = reinterpret_cast<const uint16_t*>(rows.v);
  }
  internal::AttendRowsArgs args;
  args.q = q_rows.data();
  args.out = out_rows.data();
  args.visible = visible.data();
  args.num_q = num_q;
  args.k_blocks = k_blocks.data();
  args.v_blocks = v_blocks.data();
  args.block_size = layout.block_size;
  args.num_keys = num_keys;
  args.stride = int64_t{layout.num_kv_heads} * layout.head_row_bytes() / 2;
  args.dim = head_dim;
  args.scale = scale;
  args.f16 = layout.dtype == KvDtype::kF16;
  ops.attend_rows(args);
}

template <KvDtype D>
void paged_attention_as(std::span<const AttentionSeq> seqs, const float* q, int num_heads,
                        int layer, const KvCacheLayout& layout, const std::byte* kv_base,
                        float scale, float* out, ThreadPool& pool) {
  const int num_kv_heads = layout.num_kv_heads;
  const int group = num_heads / num_kv_heads;
  const int head_dim = layout.head_dim;
  const int block_size = layout.block_size;
  const int64_t head_row = layout.head_row_bytes();
  const int64_t kv_row = int64_t{num_kv_heads} * head_row;
  const int64_t block_bytes = layout.block_num_bytes();
  const internal::KernelTable& ops = internal::active_table();
  const KvOps<D> kv_ops{ops};

  std::vector<Task> tasks;
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
    for (int g = 0; g < num_kv_heads; ++g) {
      for (int64_t t = 0; t < seqs[s].num_tokens; t += kQueryChunk) {
        tasks.push_back({s, g, t, std::min(seqs[s].num_tokens, t + kQueryChunk)});
      }
    }
  }
  // Longest (latest) chunks first, so the dynamic task queue balances the causal triangle.
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return seqs[a.seq].start_pos + a.t_end > seqs[b.seq].start_pos + b.t_end;
  });

  const bool tiles = (D == KvDtype::kBf16 || D == KvDtype::kF16) && ops.attend_rows != nullptr &&
                     head_dim % 16 == 0 && head_dim <= internal::kMaxTileDim;
  pool.parallel_for(static_cast<int>(tasks.size()), [&](int task_index) {
    const Task& task = tasks[task_index];
    const AttentionSeq& seq = seqs[task.seq];
    if (tiles && task.t_end - task.t_begin >= kTileMinRows) {
      attend_task_in_tiles(ops, seq, task.kv_head, task.t_begin, task.t_end, q, num_heads, group,
                           layer, layout, kv_base, scale, out);
      return;
    }
    std::vector<float> scores(block_size);
    std::vector<float> max_score(group);
    std::vector<float> sum(group);
    for (int64_t t = task.t_begin; t < task.t_end; ++t) {
      const int64_t num_keys = seq.start_pos + t + 1;
      const int64_t row = seq.q_row + t;
      for (int h = 0; h < group; ++h) {
        const int64_t head = int64_t{task.kv_head} * group + h;
        std::memset(out + (row * num_heads + head) * head_dim, 0, head_dim * sizeof(float));
        max_score[h] = -std::numeric_limits<float>::infinity();
        sum[h] = 0;
      }
      for (int64_t kb = 0; kb * block_size < num_keys; ++kb) {
        const KvHeadRows rows = kv_head_rows(
            layout, kv_base + int64_t{seq.block_table[kb]} * block_bytes, layer, task.kv_head);
        const int n = static_cast<int>(std::min<int64_t>(block_size, num_keys - kb * block_size));
        for (int h = 0; h < group; ++h) {
          const int64_t head = int64_t{task.kv_head} * group + h;
          const float* qh = q + (row * num_heads + head) * head_dim;
          float* oh = out + (row * num_heads + head) * head_dim;
          float block_max = -std::numeric_limits<float>::infinity();
          kv_ops.dot_block(qh, rows.k, kv_row, n, head_dim, scale, scores.data());
          for (int j = 0; j < n; ++j)
            block_max = std::max(block_max, scores[j]);
          const float new_max = std::max(max_score[h], block_max);
          if (new_max > max_score[h] && sum[h] > 0) {
            const float correction = std::exp(max_score[h] - new_max);
            sum[h] *= correction;
            ops.scale(correction, oh, head_dim);
          }
          max_score[h] = new_max;
          // The block's weights exp(score - max) at once (the table's vector exp).
          sum[h] += ops.exp_sum(scores.data(), n, 1.0f, new_max);
          kv_ops.axpy_block(scores.data(), rows.v, kv_row, n, head_dim, oh);
        }
      }
      for (int h = 0; h < group; ++h) {
        const int64_t head = int64_t{task.kv_head} * group + h;
        ops.scale(1.0f / sum[h], out + (row * num_heads + head) * head_dim, head_dim);
      }
    }
  });
}

}  // namespace

void write_kv(const float* k, const float* v, int64_t num_tokens, int64_t start_pos,
              const int32_t* block_table, int layer, const KvCacheLayout& layout, void* kv_base) {
  CRESCENT_CHECK(layer >= 0 && layer < layout.num_layers) << "layer " << layer;
  const int64_t row = int64_t{layout.num_kv_heads} * layout.head_dim;
  const int64_t head_row = layout.head_row_bytes();
  const int64_t part = layout.layer_part_bytes();
  auto* base_bytes = static_cast<std::byte*>(kv_base);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = start_pos + t;
    const int64_t block = block_table[pos / layout.block_size];
    const int64_t slot = pos % layout.block_size;
    std::byte* base =
        base_bytes + block * layout.block_num_bytes() + slot * layout.num_kv_heads * head_row;
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const int64_t src = t * row + int64_t{h} * layout.head_dim;
      store_kv_row(layout.dtype, k + src, layout.head_dim, base + 2 * layer * part + h * head_row);
      store_kv_row(layout.dtype, v + src, layout.head_dim,
                   base + (2 * layer + 1) * part + h * head_row);
    }
  }
}

void paged_attention(std::span<const AttentionSeq> seqs, const float* q, int num_heads, int layer,
                     const KvCacheLayout& layout, const void* kv_base, float scale, float* out,
                     ThreadPool& pool) {
  CRESCENT_CHECK(layout.num_kv_heads > 0 && num_heads % layout.num_kv_heads == 0)
      << num_heads << " heads over " << layout.num_kv_heads << " kv heads";
  CRESCENT_CHECK(layer >= 0 && layer < layout.num_layers) << "layer " << layer;
  const auto* base = static_cast<const std::byte*>(kv_base);
  switch (layout.dtype) {
    case KvDtype::kFloat32:
      return paged_attention_as<KvDtype::kFloat32>(seqs, q, num_heads, layer, layout, base, scale,
                                                   out, pool);
    case KvDtype::kBf16:
      return paged_attention_as<KvDtype::kBf16>(seqs, q, num_heads, layer, layout, base, scale, out,
                                                pool);
    case KvDtype::kF16:
      return paged_attention_as<KvDtype::kF16>(seqs, q, num_heads, layer, layout, base, scale, out,
                                               pool);
    case KvDtype::kFp8E4m3:
      return paged_attention_as<KvDtype::kFp8E4m3>(seqs, q, num_heads, layer, layout, base, scale,
                                                   out, pool);
    case KvDtype::kQ8_0:
      return paged_attention_as<KvDtype::kQ8_0>(seqs, q, num_heads, layer, layout, base, scale, out,
                                                pool);
  }
}

}  // namespace crescent::kernels
