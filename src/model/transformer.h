#pragma once
// The decoder-only transformer shared by Llama, Qwen2 and Qwen3 (DESIGN.md §7): RMSNorm, RoPE
// (with Llama-3 frequency scaling), grouped-query attention over the paged KV cache, SwiGLU MLP,
// optional QKV bias (Qwen2) and per-head q/k RMSNorm (Qwen3), tied or untied embeddings.
//
// A Transformer owns its packed weights and the mapped model files they came from. forward()
// is not thread-safe (it reuses scratch buffers); it parallelises inside through the pool.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/model_files.h"

namespace crescent::model {

struct TransformerOptions {
  // Format of the big matrices; kAuto keeps Q8_0 files as Q8_0 and stores the rest as BF16.
  enum class Weights { kAuto, kF32, kBF16, kQ8_0 };
  Weights weights = Weights::kAuto;
};

// Rows of a sequence's token_ids whose input embedding is given (an image's placeholder tokens
// take the vision encoder's output) instead of looked up in embed_tokens.
struct EmbeddingOverride {
  int64_t row = 0;  // first row within the seq's token_ids
  int64_t num_rows = 0;
  const float* data = nullptr;  // num_rows x hidden_size
};

// One sequence's slice of a forward batch.
struct ForwardSeq {
  std::span<const int32_t> token_ids;    // tokens computed in this call
  int64_t start_pos = 0;                 // position of token_ids[0]
  std::span<const int32_t> block_table;  // KV blocks covering [0, start_pos + size)
  bool needs_logits = false;             // logits of the last token wanted
  // M-RoPE models: [token][3] rotary positions (temporal, height, width). Empty: start_pos + i
  // on every axis. KV slots and causality always follow start_pos + i.
  std::span<const int32_t> positions3;
  std::span<const EmbeddingOverride> embeddings;  // ordered, disjoint, inside token_ids
};

class Transformer {
 public:
  // Packs the weights of `files` (which it takes over) for the kernels.
  static Result<std::unique_ptr<Transformer>> load(ModelFiles files,
                                                   const TransformerOptions& options,
                                                   ThreadPool& pool);

  const ModelConfig& config() const { return files_.config; }
  const std::string& name() const { return files_.name; }
  const ModelFiles& files() const { return files_; }
  kernels::KvCacheLayout kv_layout(int block_size, kernels::KvDtype dtype) const;
  // Bytes of packed weights that one decode step streams (for bandwidth figures).
  int64_t num_weight_bytes() const { return num_weight_bytes_; }
  // Multiply-adds per token in the matrices (rows x cols summed), for FLOP figures.
  int64_t num_weight_params() const { return num_weight_params_; }
  // The part of num_weight_params() in lm_head, which a prefill runs for its last token only.
  int64_t num_lm_head_params() const { return lm_head_.rows() * lm_head_.cols(); }
  kernels::WeightFormat weight_format() const { return format_; }
  // The format holding most bytes of the packed matrices (a GGUF may mix them per tensor; the
  // embedding's type, weight_format(), need not be among them).
  kernels::WeightFormat matrix_format() const;
  // "BF16", "GGUF Q4_K", or "mixed Q5_0 41% Q8_0 39% ..." by bytes.
  std::string weight_format_name() const;
  // A 64-bit hash of the weights as loaded: every norm and bias vector whole, and the shape,
  // format and first and last bytes of every matrix and of the embedding table. Computed once
  // at load; two checkpoints of the same shape (or one in two weight formats) differ.
  uint64_t weights_fingerprint() const { return weights_fingerprint_; }

  // Runs every sequence's tokens through the model, writing their K/V into kv_base (laid out as
  // kv_layout()) and appending the logits of each seq with needs_logits to `logits`
  // (count * vocab floats, in batch order).
  Status forward(std::span<const ForwardSeq> batch, const kernels::KvCacheLayout& layout,
                 void* kv_base, std::vector<float>& logits);

 private:
  struct Layer {
    std::vector<float> input_norm;
    std::vector<float> post_attention_norm;
    std::vector<float> q_norm;  // Qwen3 only
    std::vector<float> k_norm;
    // One matrix whose rows are q heads, then k heads, then v heads; or q, k and v apart when a
    // GGUF file stores them in different block types (Q4_K_M: Q4_K q / k, Q6_K v in some
    // layers), each computed in its own type rather than requantised to a common one.
    std::vector<kernels::PackedWeight> qkv;
    std::vector<float> qkv_bias;  // q, k, v
    kernels::PackedWeight o;
    // rows: gate, then up (llama-quantize's mixes type the two alike: parts of different types
    // are computed in the wider one)
    kernels::PackedWeight gate_up;
    kernels::PackedWeight down;

    // Every matrix of the layer, in a fixed order.
    [[nodiscard]] std::vector<const kernels::PackedWeight*> matrices() const;
  };

  Transformer(ModelFiles files, ThreadPool& pool);
  Status load_weights(const TransformerOptions& options);
  uint64_t compute_weights_fingerprint() const;
  void embed(std::span<const int32_t> token_ids, float* out) const;
  // (bytes, format) of the packed matrices, largest first.
  std::vector<std::pair<int64_t, kernels::WeightFormat>> matrix_format_shares() const;

  ModelFiles files_;
  ThreadPool& pool_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  kernels::PackedWeight lm_head_;
  TensorView embed_tokens_;  // raw view into the mapped file, converted row by row
  std::unique_ptr<kernels::RopeTable> rope_;
  kernels::WeightFormat format_ = kernels::WeightFormat::kBF16;

  uint64_t weights_fingerprint_ = 0;
  int64_t num_weight_bytes_ = 0;
  int64_t num_weight_params_ = 0;

  // Scratch, grown on demand.
  std::vector<float> x_, h_, qkv_, q_, attn_, proj_, gate_up_, act_, final_rows_;
  std::vector<int32_t> positions_;
  std::vector<int32_t> positions3_;  // [rows][3], M-RoPE models only
};

}  // namespace crescent::model
