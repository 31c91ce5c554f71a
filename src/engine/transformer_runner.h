#pragma once
// TransformerRunner: the engine's ModelRunner over a real model::Transformer and a paged KV
// cache that it owns. The KV cache is one contiguous, page-aligned region laid out as
// kernels::KvCacheLayout (one block = all layers of block_size tokens), so a run of
// consecutive block ids is one contiguous byte range for the transfer engine.
//
// Not thread-safe: the engine calls execute() from one thread.

#include <cstdint>
#include <functional>
#include <memory>

#include "engine/model_runner.h"
#include "kernels/kernels.h"
#include "model/transformer.h"

namespace crescent::engine {

struct KvCacheOptions {
  int block_size = 16;
  // Either a block count, or (when 0) as many blocks as fit in kv_cache_bytes.
  int num_blocks = 0;
  int64_t kv_cache_bytes = int64_t{1} << 30;
  // The stored element type; bf16 blocks take half the bytes, so a budget holds twice as many.
  kernels::KvDtype dtype = kernels::KvDtype::kFloat32;
};

// Memory for the KV cache; the default allocator uses anonymous mmap. A caller that needs the
// cache in shareable memory (disaggregation) passes its own allocation.
struct KvCacheMemory {
  void* base = nullptr;
  int64_t num_bytes = 0;
  std::function<void()> release;  // frees base; may be empty
};
Result<KvCacheMemory> allocate_private_kv_memory(int64_t num_bytes);

class TransformerRunner : public ModelRunner {
 public:
  // memory == nullopt: allocates privately.
  static Result<std::unique_ptr<TransformerRunner>> create(
      model::Transformer& model, const KvCacheOptions& options,
      std::optional<KvCacheMemory> memory = {});
  ~TransformerRunner() override;

  int32_t vocab_size() const override { return model_.config().vocab_size; }
  int32_t num_kv_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return layout_.block_size; }
  Status execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) override;

  const kernels::KvCacheLayout& kv_layout() const { return layout_; }
  void* kv_base() const { return memory_.base; }
  int64_t kv_num_bytes() const { return memory_.num_bytes; }
  model::Transformer& model() { return model_; }

 private:
  TransformerRunner(model::Transformer& model, kernels::KvCacheLayout layout, int num_blocks,
                    KvCacheMemory memory);

  model::Transformer& model_;
  kernels::KvCacheLayout layout_;
  int num_blocks_;
  KvCacheMemory memory_;
  std::vector<model::ForwardSeq> forward_batch_;
  std::vector<model::EmbeddingOverride> embedding_scratch_;
};

}  // namespace crescent::engine
