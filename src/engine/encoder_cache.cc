#include "engine/encoder_cache.h"

#include "core/check.h"

namespace crescent::engine {

EncoderCache::EncoderCache(int64_t capacity_tokens) : capacity_tokens_(capacity_tokens) {
  CRESCENT_CHECK(capacity_tokens >= 0) << capacity_tokens;
}

EncoderCache::Embeddings EncoderCache::acquire(const std::string& mm_hash) {
  auto it = entries_.find(mm_hash);
  if (it == entries_.end()) {
    ++num_misses_;
    return nullptr;
  }
  ++num_hits_;
  Entry& e = it->second;
  if (e.in_lru) {
    lru_.erase(e.lru_pos);
    e.in_lru = false;
    num_unreferenced_tokens_ -= e.num_tokens;
  }
  ++e.ref_count;
  return e.embeddings;
}

void EncoderCache::release(const std::string& mm_hash) {
  auto it = entries_.find(mm_hash);
  CRESCENT_CHECK(it != entries_.end()) << "release of unknown encoder cache entry " << mm_hash;
  Entry& e = it->second;
  CRESCENT_CHECK(e.ref_count > 0) << "encoder cache entry " << mm_hash << " over-released";
  if (--e.ref_count == 0) {
    e.lru_pos = lru_.insert(lru_.end(), mm_hash);
    e.in_lru = true;
    num_unreferenced_tokens_ += e.num_tokens;
  }
}

bool EncoderCache::can_insert(int64_t num_tokens) const {
  return num_tokens_used_ - num_unreferenced_tokens_ + num_tokens <= capacity_tokens_;
}

EncoderCache::Embeddings EncoderCache::insert(const std::string& mm_hash, Embeddings embeddings,
                                              int64_t num_tokens) {
  CRESCENT_CHECK(!contains(mm_hash)) << "encoder cache entry " << mm_hash << " inserted twice";
  CRESCENT_CHECK(can_insert(num_tokens)) << "encoder cache cannot fit " << num_tokens;
  while (num_tokens_used_ + num_tokens > capacity_tokens_) {
    evict_one();
  }
  Entry& e = entries_[mm_hash];
  e.embeddings = std::move(embeddings);
  e.num_tokens = num_tokens;
  e.ref_count = 1;
  num_tokens_used_ += num_tokens;
  return e.embeddings;
}

void EncoderCache::evict_one() {
  CRESCENT_CHECK(!lru_.empty()) << "encoder cache: nothing left to evict";
  auto it = entries_.find(lru_.front());
  lru_.pop_front();
  num_tokens_used_ -= it->second.num_tokens;
  num_unreferenced_tokens_ -= it->second.num_tokens;
  entries_.erase(it);
  ++num_evictions_;
}

EncoderCacheStats EncoderCache::stats() const {
  EncoderCacheStats s;
  s.capacity_tokens = capacity_tokens_;
  s.num_tokens_used = num_tokens_used_;
  s.num_entries = static_cast<int>(entries_.size());
  s.num_referenced = static_cast<int>(entries_.size() - lru_.size());
  s.num_hits = num_hits_;
  s.num_misses = num_misses_;
  s.num_evictions = num_evictions_;
  return s;
}

}  // namespace crescent::engine
