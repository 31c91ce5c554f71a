#pragma once
// Sequence: the engine's state of one request as the scheduler and the block manager see it:
// its tokens (prompt then output), how many have K/V computed, its block table and its
// sampling state. Owned by the Engine; the Scheduler and BlockManager hold pointers.
// Not thread-safe.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace crescent::engine {

enum class SequenceStatus {
  kWaiting,    // queued, holds no blocks
  kRunning,    // holds blocks; computing its prompt or decoding
  kPreempted,  // lost its blocks to a more senior request; queued again and will recompute
  // Decode side of P/D disaggregation: holds blocks for its whole prompt while a prefill engine
  // writes the prompt's K/V into them; never scheduled for compute and never preempted.
  kWaitingForRemoteKv,
  kFinished,
};

// A run of prompt tokens that stand for one image: the prefix cache keys every block the run
// touches with the image's content (`key`), so equal text with different images never shares
// K/V.
struct MmPlaceholder {
  int offset = 0;
  int num_tokens = 0;
  uint64_t key = 0;
};

struct Sequence {
  std::string request_id;
  std::vector<int32_t> token_ids;  // prompt followed by output
  int num_prompt_tokens = 0;
  // Tokens whose K/V sits in this sequence's blocks (from the prefix cache or computed).
  int num_computed_tokens = 0;
  // Prompt tokens the prefix cache served when the request was first scheduled.
  int num_cached_tokens = 0;
  bool has_been_scheduled = false;
  // Its prompt's K/V is to come from a remote prefill (do_remote_prefill) when it is first
  // admitted; cleared then, so a later preemption recomputes locally like any other request.
  bool needs_remote_kv = false;
  std::vector<MmPlaceholder> mm_placeholders;  // ordered, disjoint, inside the prompt
  std::vector<int32_t> block_table;            // block ids, covering at least the computed tokens
  std::vector<uint64_t> block_hashes;          // chained hashes of the leading full computed blocks
  SequenceStatus status = SequenceStatus::kWaiting;
  SamplingParams sampling;
  int64_t arrival_time_ns = 0;
  uint64_t arrival_order = 0;  // strictly increasing with arrival; the preemption order
  Rng rng;
  int num_preemptions = 0;
  bool is_scheduled_this_step = false;  // scratch for the scheduler

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt_token_ids() const {
    return std::span<const int32_t>(token_ids).first(num_prompt_tokens);
  }
  std::span<const int32_t> output_token_ids() const {
    return std::span<const int32_t>(token_ids).subspan(num_prompt_tokens);
  }
  bool is_finished() const { return status == SequenceStatus::kFinished; }
};

}  // namespace crescent::engine
