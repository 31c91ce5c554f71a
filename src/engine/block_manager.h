#pragma once
// BlockManager: the accounting of the paged KV cache (the memory itself belongs to the
// ModelRunner). Fixed-size blocks of block_size tokens, reference counted so that sequences
// share a cached prefix, and a prefix cache keyed by a chained hash of FULL computed blocks:
// hash(parent block's hash, the block's token ids, the content keys of the images whose
// placeholder tokens the block covers), with the tokens and image key stored beside it so that
// a hash collision can never hand out wrong K/V. Unreferenced cached blocks stay cached until a
// fresh block is needed; never-cached free blocks are used first, then cached ones in least
// recently used order. Not thread-safe (the engine's thread only).

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "engine/sequence.h"

namespace crescent::engine {

class KvEventLog;

struct BlockIdTag {};
using BlockId = StrongId<BlockIdTag, int32_t>;

struct BlockManagerStats {
  int num_blocks_total = 0;
  int num_blocks_used = 0;    // referenced by at least one sequence
  int num_blocks_cached = 0;  // holding a registered prefix-cache entry (used or free)
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hits_tokens = 0;
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  bool is_prefix_caching_enabled() const { return enable_prefix_caching_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int num_free_blocks() const;  // unreferenced, cached or not
  bool can_allocate(int num_blocks) const { return num_blocks <= num_free_blocks(); }
  int num_blocks_for_tokens(int num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // First allocation of a sequence (new, or preempted and now recomputing): blocks for all
  // its tokens, reusing the longest cached prefix of full blocks. At least the last token is
  // always left to compute (its logits are needed), so a fully cached prompt recomputes its
  // last block. Sets num_computed_tokens to the cached length and returns it.
  // Precondition: can_allocate_for_prompt(seq) and an empty block table.
  bool can_allocate_for_prompt(const Sequence& seq) const;
  int allocate_for_prompt(Sequence& seq);

  // Decode growth: blocks so that the table covers every known token of seq.
  bool can_append(const Sequence& seq) const;
  void append_slots(Sequence& seq);

  // Registers the blocks that became full and computed (call after num_computed_tokens grows).
  void commit_computed(Sequence& seq);

  // Drops seq's references (last block first, so the tail of a prompt is evicted before its
  // head) and clears its table, hashes and num_computed_tokens.
  void free(Sequence& seq);

  // Where stored and evicted prefix-cache hashes are reported (kv_events.h); null: nowhere.
  // The log must outlive this object.
  void set_event_log(KvEventLog* log) { event_log_ = log; }

  int ref_count(BlockId id) const { return blocks_[id.value()].ref_count; }
  BlockManagerStats stats() const;

  // Checks that ref counts equal the references from `live` (every sequence holding blocks),
  // that the prefix map and the blocks agree, and that the free lists are exactly the
  // unreferenced blocks. Returns the first violation found. For tests.
  Status check_invariants(std::span<const Sequence* const> live) const;

 private:
  struct Block {
    int ref_count = 0;
    bool has_hash = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> token_ids;  // the block's tokens when has_hash
    uint64_t mm_key = 0;             // the images it covers (0: none) when has_hash
    bool in_lru = false;
    std::list<int32_t>::iterator lru_pos;
  };

  static uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> token_ids,
                             uint64_t mm_key);
  // The content keys of the images whose placeholders overlap block block_index, folded; 0 if
  // none.
  uint64_t block_mm_key(const Sequence& seq, int block_index) const;
  std::span<const int32_t> block_tokens(const Sequence& seq, int block_index) const;
  // The cached blocks matching seq's leading full blocks (at most num_tokens - 1 tokens).
  std::vector<BlockId> find_cached_prefix(const Sequence& seq, std::vector<uint64_t>* hashes) const;
  BlockId take_free_block();
  void release(BlockId id);

  int block_size_;
  bool enable_prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_uncached_;  // free and holding no cache entry; used first
  std::list<int32_t> free_cached_lru_;  // free cached blocks, least recently used first
  std::unordered_map<uint64_t, int32_t> cached_blocks_;  // hash -> block
  int num_used_blocks_ = 0;
  KvEventLog* event_log_ = nullptr;
  int64_t prefix_cache_queries_tokens_ = 0;
  int64_t prefix_cache_hits_tokens_ = 0;
};

}  // namespace crescent::engine
