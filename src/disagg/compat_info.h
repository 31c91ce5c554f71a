#pragma once
// KvCompatInfo: what two engines must agree on before one writes KV blocks into the other's
// memory (DESIGN.md §2: model, dtype, layer count, KV heads, head size, block size, layout) and
// the weights they were computed with.
// Exchanged in the connector's HELLO; a mismatch is refused with a message naming the field.

#include <cstdint>
#include <string>

namespace crescent::disagg {

struct KvCompatInfo {
  std::string model;  // model name or path as the engine reports it
  std::string dtype;  // KV cache dtype: "float32" or "bf16" (kernels::kv_dtype_name)
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;  // tokens per KV block
  std::string layout;  // how one block's bytes are laid out, e.g. "block:layer:kv:token:head:dim"
  // The weights as loaded, e.g. "3f9c0a1b2c3d4e5f BF16" (Transformer::weights_fingerprint and
  // the weight format): two checkpoints of one shape (a base model and its fine-tune) differ
  // here, so one never decodes the other's KV.
  std::string weights;

  // A stable 64-bit FNV-1a hash of every field (the same on every host and build).
  uint64_t hash() const;
  friend bool operator==(const KvCompatInfo&, const KvCompatInfo&) = default;
};

// The first field that differs, in words: "block_size: 16 here, 32 at the peer". Empty when
// the two are equal.
std::string describe_first_difference(const KvCompatInfo& here, const KvCompatInfo& peer);

}  // namespace crescent::disagg
