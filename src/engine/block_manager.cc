#include "engine/block_manager.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "engine/kv_events.h"

namespace crescent::engine {
namespace {

Status violation(const std::string& what) {
  return internal_error("block manager invariant: " + what);
}

}  // namespace

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), enable_prefix_caching_(enable_prefix_caching), blocks_(num_blocks) {
  CRESCENT_CHECK(num_blocks > 0 && block_size > 0) << num_blocks << " blocks of " << block_size;
  // Hand out low ids first: the stack is popped from the back.
  free_uncached_.reserve(num_blocks);
  for (int32_t i = num_blocks - 1; i >= 0; --i) {
    free_uncached_.push_back(i);
  }
}

int BlockManager::num_free_blocks() const {
  return static_cast<int>(free_uncached_.size() + free_cached_lru_.size());
}

uint64_t BlockManager::hash_block(uint64_t parent_hash, std::span<const int32_t> token_ids,
                                  uint64_t mm_key) {
  return hash_token_block(parent_hash, token_ids, mm_key);
}

uint64_t BlockManager::block_mm_key(const Sequence& seq, int block_index) const {
  const int begin = block_index * block_size_;
  const int end = begin + block_size_;
  uint64_t key = 0;
  for (const MmPlaceholder& p : seq.mm_placeholders) {
    if (p.offset < end && p.offset + p.num_tokens > begin) {
      // Which part of the image the block holds matters too (a block inside an image run).
      key = mix_hash64(key ^ p.key ^ static_cast<uint64_t>(begin - p.offset + (1LL << 40)));
    }
  }
  return key;
}

std::span<const int32_t> BlockManager::block_tokens(const Sequence& seq, int block_index) const {
  return std::span<const int32_t>(seq.token_ids).subspan(block_index * block_size_, block_size_);
}

std::vector<BlockId> BlockManager::find_cached_prefix(const Sequence& seq,
                                                      std::vector<uint64_t>* hashes) const {
  std::vector<BlockId> hits;
  if (!enable_prefix_caching_) {
    return hits;
  }
  const int max_hit_blocks = (seq.num_tokens() - 1) / block_size_;
  uint64_t parent = 0;
  for (int i = 0; i < max_hit_blocks; ++i) {
    std::span<const int32_t> tokens = block_tokens(seq, i);
    const uint64_t mm_key = block_mm_key(seq, i);
    const uint64_t h = hash_block(parent, tokens, mm_key);
    auto it = cached_blocks_.find(h);
    if (it == cached_blocks_.end()) {
      break;
    }
    const Block& block = blocks_[it->second];
    if (block.parent_hash != parent || block.mm_key != mm_key ||
        !std::ranges::equal(block.token_ids, tokens)) {
      break;  // a 64-bit collision: treat as a miss
    }
    hits.push_back(BlockId(it->second));
    if (hashes != nullptr) {
      hashes->push_back(h);
    }
    parent = h;
  }
  return hits;
}

bool BlockManager::can_allocate_for_prompt(const Sequence& seq) const {
  int needed = num_blocks_for_tokens(seq.num_tokens());
  for (BlockId id : find_cached_prefix(seq, nullptr)) {
    if (blocks_[id.value()].ref_count > 0) {
      --needed;  // shared, costs nothing; a free cached block still uses up a free slot
    }
  }
  return can_allocate(needed);
}

BlockId BlockManager::take_free_block() {
  int32_t id;
  if (!free_uncached_.empty()) {
    id = free_uncached_.back();
    free_uncached_.pop_back();
  } else {
    CRESCENT_CHECK(!free_cached_lru_.empty()) << "no free KV block; call can_allocate first";
    id = free_cached_lru_.front();
    Block& block = blocks_[id];
    free_cached_lru_.pop_front();
    block.in_lru = false;
    cached_blocks_.erase(block.hash);  // evict
    if (event_log_ != nullptr) {
      event_log_->record_removed(block.hash);
    }
    block.has_hash = false;
    block.token_ids.clear();
  }
  Block& block = blocks_[id];
  CRESCENT_CHECK_EQ(block.ref_count, 0);
  block.ref_count = 1;
  ++num_used_blocks_;
  return BlockId(id);
}

int BlockManager::allocate_for_prompt(Sequence& seq) {
  CRESCENT_CHECK(seq.block_table.empty()) << seq.request_id << " already holds blocks";
  CRESCENT_CHECK(can_allocate_for_prompt(seq)) << seq.request_id;
  seq.block_hashes.clear();
  for (BlockId id : find_cached_prefix(seq, &seq.block_hashes)) {
    Block& block = blocks_[id.value()];
    if (block.ref_count == 0) {
      CRESCENT_CHECK(block.in_lru) << "free cached block " << id << " is not on the LRU list";
      free_cached_lru_.erase(block.lru_pos);
      block.in_lru = false;
      ++num_used_blocks_;
    }
    ++block.ref_count;
    seq.block_table.push_back(id.value());
  }
  const int num_cached_tokens = static_cast<int>(seq.block_table.size()) * block_size_;
  const int num_blocks = num_blocks_for_tokens(seq.num_tokens());
  while (static_cast<int>(seq.block_table.size()) < num_blocks) {
    seq.block_table.push_back(take_free_block().value());
  }
  seq.num_computed_tokens = num_cached_tokens;
  if (enable_prefix_caching_) {
    prefix_cache_queries_tokens_ += seq.num_tokens();
    prefix_cache_hits_tokens_ += num_cached_tokens;
  }
  return num_cached_tokens;
}

bool BlockManager::can_append(const Sequence& seq) const {
  const int missing =
      num_blocks_for_tokens(seq.num_tokens()) - static_cast<int>(seq.block_table.size());
  return missing <= 0 || can_allocate(missing);
}

void BlockManager::append_slots(Sequence& seq) {
  CRESCENT_CHECK(can_append(seq)) << seq.request_id;
  const int num_blocks = num_blocks_for_tokens(seq.num_tokens());
  while (static_cast<int>(seq.block_table.size()) < num_blocks) {
    seq.block_table.push_back(take_free_block().value());
  }
}

void BlockManager::commit_computed(Sequence& seq) {
  if (!enable_prefix_caching_) {
    return;
  }
  const int num_full = seq.num_computed_tokens / block_size_;
  CRESCENT_CHECK_LE(num_full, static_cast<int>(seq.block_table.size()));
  std::vector<uint64_t> stored;
  for (int i = static_cast<int>(seq.block_hashes.size()); i < num_full; ++i) {
    const uint64_t parent = i == 0 ? 0 : seq.block_hashes[i - 1];
    std::span<const int32_t> tokens = block_tokens(seq, i);
    const uint64_t mm_key = block_mm_key(seq, i);
    const uint64_t h = hash_block(parent, tokens, mm_key);
    seq.block_hashes.push_back(h);
    Block& block = blocks_[seq.block_table[i]];
    if (block.has_hash || cached_blocks_.contains(h)) {
      continue;  // someone else computed the same block first: keep theirs
    }
    block.has_hash = true;
    block.hash = h;
    block.parent_hash = parent;
    block.token_ids.assign(tokens.begin(), tokens.end());
    block.mm_key = mm_key;
    cached_blocks_.emplace(h, seq.block_table[i]);
    stored.push_back(h);
  }
  if (event_log_ != nullptr) {
    event_log_->record_stored(std::move(stored));
  }
}

void BlockManager::release(BlockId id) {
  Block& block = blocks_[id.value()];
  CRESCENT_CHECK(block.ref_count > 0) << "double free of block " << id;
  if (--block.ref_count > 0) {
    return;
  }
  --num_used_blocks_;
  if (block.has_hash) {
    free_cached_lru_.push_back(id.value());
    block.lru_pos = std::prev(free_cached_lru_.end());
    block.in_lru = true;
  } else {
    free_uncached_.push_back(id.value());
  }
}

void BlockManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    release(BlockId(*it));
  }
  seq.block_table.clear();
  seq.block_hashes.clear();
  seq.num_computed_tokens = 0;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks_total = num_blocks();
  s.num_blocks_used = num_used_blocks_;
  s.num_blocks_cached = static_cast<int>(cached_blocks_.size());
  s.prefix_cache_queries_tokens = prefix_cache_queries_tokens_;
  s.prefix_cache_hits_tokens = prefix_cache_hits_tokens_;
  return s;
}

Status BlockManager::check_invariants(std::span<const Sequence* const> live) const {
  std::ostringstream os;
  std::vector<int> refs(blocks_.size(), 0);
  for (const Sequence* seq : live) {
    for (int32_t id : seq->block_table) {
      if (id < 0 || id >= num_blocks()) {
        os << seq->request_id << " holds out-of-range block " << id;
        return violation(os.str());
      }
      ++refs[id];
    }
    if (seq->num_computed_tokens > static_cast<int>(seq->block_table.size()) * block_size_) {
      os << seq->request_id << " computed " << seq->num_computed_tokens << " tokens in "
         << seq->block_table.size() << " blocks";
      return violation(os.str());
    }
    if (static_cast<int>(seq->block_hashes.size()) * block_size_ > seq->num_computed_tokens) {
      os << seq->request_id << " has hashes for uncomputed blocks";
      return violation(os.str());
    }
  }
  int num_used = 0;
  std::vector<int> free_seen(blocks_.size(), 0);
  for (int32_t id : free_uncached_) {
    ++free_seen[id];
    if (blocks_[id].has_hash || blocks_[id].in_lru) {
      os << "block " << id << " is on the uncached free list but cached";
      return violation(os.str());
    }
  }
  for (int32_t id : free_cached_lru_) {
    ++free_seen[id];
    if (!blocks_[id].has_hash || !blocks_[id].in_lru || *blocks_[id].lru_pos != id) {
      os << "block " << id << " is on the LRU list but not marked cached";
      return violation(os.str());
    }
  }
  for (int32_t id = 0; id < num_blocks(); ++id) {
    const Block& block = blocks_[id];
    if (block.ref_count != refs[id]) {
      os << "block " << id << " has ref count " << block.ref_count << " but " << refs[id]
         << " table references";
      return violation(os.str());
    }
    if (block.ref_count > 0) {
      ++num_used;
    }
    const int expected_free = block.ref_count == 0 ? 1 : 0;
    if (free_seen[id] != expected_free) {
      os << "block " << id << " (ref " << block.ref_count << ") is on free lists " << free_seen[id]
         << " times";
      return violation(os.str());
    }
    if (block.in_lru != (block.ref_count == 0 && block.has_hash)) {
      os << "block " << id << " LRU flag disagrees with its state";
      return violation(os.str());
    }
    if (block.has_hash) {
      auto it = cached_blocks_.find(block.hash);
      if (it == cached_blocks_.end() || it->second != id) {
        os << "block " << id << " is marked cached but the map does not point to it";
        return violation(os.str());
      }
      if (static_cast<int>(block.token_ids.size()) != block_size_ ||
          hash_block(block.parent_hash, block.token_ids, block.mm_key) != block.hash) {
        os << "block " << id << " stored tokens do not match its hash";
        return violation(os.str());
      }
    }
  }
  for (const auto& [hash, id] : cached_blocks_) {
    if (!blocks_[id].has_hash || blocks_[id].hash != hash) {
      os << "map entry for block " << id << " disagrees with the block";
      return violation(os.str());
    }
  }
  if (num_used != num_used_blocks_) {
    os << "used block count " << num_used_blocks_ << " but " << num_used << " referenced";
    return violation(os.str());
  }
  return Status::ok();
}

}  // namespace crescent::engine
