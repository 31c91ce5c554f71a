#include "engine/transformer_runner.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/errno_text.h"

namespace crescent::engine {

Result<KvCacheMemory> allocate_private_kv_memory(int64_t num_bytes) {
  void* p = ::mmap(nullptr, static_cast<size_t>(num_bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return resource_exhausted("cannot allocate " + std::to_string(num_bytes >> 20) +
                              " MiB for the KV cache: " + errno_text(err));
  }
  ::madvise(p, static_cast<size_t>(num_bytes), MADV_HUGEPAGE);
  return KvCacheMemory{p, num_bytes,
                       [p, num_bytes] { ::munmap(p, static_cast<size_t>(num_bytes)); }};
}

Result<std::unique_ptr<TransformerRunner>> TransformerRunner::create(
    model::Transformer& model, const KvCacheOptions& options, std::optional<KvCacheMemory> memory) {
  if (options.block_size <= 0 || options.block_size > 1024) {
    return invalid_argument("block size must be in [1, 1024], got " +
                            std::to_string(options.block_size));
  }
  kernels::KvCacheLayout layout = model.kv_layout(options.block_size, options.dtype);
  RETURN_IF_ERROR(kernels::check_kv_dtype(options.dtype, layout.head_dim));
  const int64_t block_bytes = layout.block_num_bytes();
  int64_t num_blocks = options.num_blocks;
  if (num_blocks <= 0) {
    int64_t budget = memory ? memory->num_bytes : options.kv_cache_bytes;
    num_blocks = budget / block_bytes;
  }
  if (num_blocks < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                            " bytes holds no block of " + std::to_string(block_bytes) + " bytes");
  }
  num_blocks = std::min<int64_t>(num_blocks, INT32_MAX / 2);
  const int64_t need = num_blocks * block_bytes;
  if (!memory) {
    ASSIGN_OR_RETURN(memory, allocate_private_kv_memory(need));
  } else if (memory->num_bytes < need) {
    return invalid_argument("KV cache memory of " + std::to_string(memory->num_bytes) +
                            " bytes is smaller than " + std::to_string(num_blocks) + " blocks");
  }
  return std::unique_ptr<TransformerRunner>(
      new TransformerRunner(model, layout, static_cast<int>(num_blocks), std::move(*memory)));
}

TransformerRunner::TransformerRunner(model::Transformer& model, kernels::KvCacheLayout layout,
                                     int num_blocks, KvCacheMemory memory)
    : model_(model), layout_(layout), num_blocks_(num_blocks), memory_(std::move(memory)) {}

TransformerRunner::~TransformerRunner() {
  if (memory_.release) {
    memory_.release();
  }
}

Status TransformerRunner::execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) {
  logits.clear();
  forward_batch_.clear();
  embedding_scratch_.clear();
  size_t num_overrides = 0;
  for (const RunnerSeq& s : batch) {
    num_overrides += s.embeddings.size();
  }
  embedding_scratch_.reserve(num_overrides);  // the spans below must not move
  for (const RunnerSeq& s : batch) {
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= num_blocks_) {
        return invalid_argument("block id " + std::to_string(b) + " outside the KV cache of " +
                                std::to_string(num_blocks_) + " blocks");
      }
    }
    model::ForwardSeq f;
    f.token_ids = s.token_ids;
    f.start_pos = s.start_pos;
    f.block_table = s.block_table;
    f.needs_logits = s.needs_logits;
    f.positions3 = s.positions3;
    if (!s.embeddings.empty()) {
      const size_t first = embedding_scratch_.size();
      for (const InputEmbeddings& e : s.embeddings) {
        embedding_scratch_.push_back({e.row, e.num_rows, e.data});
      }
      f.embeddings = std::span<const model::EmbeddingOverride>(embedding_scratch_)
                         .subspan(first, s.embeddings.size());
    }
    forward_batch_.push_back(f);
  }
  return model_.forward(forward_batch_, layout_, kv_base(), logits);
}

}  // namespace crescent::engine
