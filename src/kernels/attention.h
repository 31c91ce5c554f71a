#pragma once
// The paged KV cache layout and causal paged attention over it.
//
// Layout: block b starts at byte kv_base + b * block_num_bytes(). Inside a block, layer l's K
// part starts at byte (2*l) * layer_part_bytes() and its V part at (2*l+1) * layer_part_bytes(),
// each [token_in_block][kv_head] of head rows, one head row being head_dim values stored as
// `dtype` in head_row_bytes() = kv_row_bytes(dtype, head_dim) bytes (q8_0: head_dim / 32 ggml
// blocks). One block therefore holds every layer of block_size tokens contiguously, and
// consecutive block ids are contiguous memory, so the transfer engine moves a prompt's KV as a
// few large copies.
//
// The engine owns the KV memory; these functions only read/write through the block table.
// Thread-safety: write_kv and paged_attention on the same blocks must not overlap in time.

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/kv_dtype.h"

namespace crescent::kernels {

struct KvCacheLayout {
  int num_layers = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kFloat32;

  int64_t head_row_bytes() const { return kv_row_bytes(dtype, head_dim); }
  int64_t layer_part_bytes() const { return int64_t{block_size} * num_kv_heads * head_row_bytes(); }
  int64_t block_num_bytes() const { return 2 * int64_t{num_layers} * layer_part_bytes(); }
};

// Writes k and v ([num_tokens][num_kv_heads][head_dim]) of the tokens at positions
// start_pos, start_pos+1, ... into slot (block_table[pos / block_size], pos % block_size),
// converted to layout.dtype.
void write_kv(const float* k, const float* v, int64_t num_tokens, int64_t start_pos,
              const int32_t* block_table, int layer, const KvCacheLayout& layout, void* kv_base);

struct AttentionSeq {
  int64_t q_row;       // first row of this sequence in q/out
  int64_t num_tokens;  // query rows of this sequence
  int64_t start_pos;   // position of its first query row
  const int32_t* block_table;
};

// Causal attention with grouped-query heads (num_heads % num_kv_heads == 0) and online
// softmax, reading K/V in place through each sequence's block table: row t of a sequence sits
// at position start_pos + t and attends to positions [0, start_pos + t], whose K/V must have
// been written. q, out: [rows][num_heads][head_dim]. Parallel over (sequence, kv head, chunk of
// 16 query rows); each output row is computed by one task, so results do not depend on the
// pool size. Stored K/V (bf16, f16, fp8_e4m3, q8_0) are widened to f32 in registers; the math
// is f32 either way.
void paged_attention(std::span<const AttentionSeq> seqs, const float* q, int num_heads, int layer,
                     const KvCacheLayout& layout, const void* kv_base, float scale, float* out,
                     ThreadPool& pool);

}  // namespace crescent::kernels
