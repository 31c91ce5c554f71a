#pragma once
// ModelRunner: what the engine needs from a model with a paged KV cache. The engine owns the
// block accounting (BlockManager); the runner owns the KV memory and computes tokens into the
// block slots it is told to use. Slot of position p = block_table[p / block_size] * block_size
// + p % block_size. Called from one thread (the engine's).

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace crescent::engine {

// Rows of token_ids whose input embedding is given instead of looked up (an image's
// placeholder tokens get the vision encoder's output).
struct InputEmbeddings {
  int64_t row = 0;  // first row within the seq's token_ids
  int64_t num_rows = 0;
  const float* data = nullptr;  // num_rows x hidden_size floats
};

struct RunnerSeq {
  std::span<const int32_t> token_ids;    // tokens to compute this step
  int64_t start_pos = 0;                 // position of token_ids[0]
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + token_ids.size())
  bool needs_logits = false;             // logits of the LAST token wanted
  // M-RoPE models: three rotary positions per token ([token][3]); empty: start_pos + i on
  // every axis. The KV slot is always start_pos + i.
  std::span<const int32_t> positions3;
  std::span<const InputEmbeddings> embeddings;  // ordered, disjoint, inside token_ids
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t num_kv_blocks() const = 0;  // how many blocks the runner's KV memory holds
  virtual int32_t block_size() const = 0;
  // Computes every seq's tokens (writing their K/V into the block slots) and fills logits for
  // the seqs with needs_logits, in order: logits.size() = count * vocab. Positions before
  // start_pos were computed by earlier calls (or come from the prefix cache) and are read
  // through the block table.
  virtual Status execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) = 0;
};

}  // namespace crescent::engine
