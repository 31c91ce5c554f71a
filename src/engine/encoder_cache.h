#pragma once
// EncoderCache: the vision encoder's outputs keyed by mm_hash, so that an image seen again
// (the same request preempted and recomputed, or another request with the same image) is not
// encoded twice. Bounded by a budget in embedding rows (tokens). Requests reference the entries
// they still need; only unreferenced entries are evicted, least recently used first. Entries
// are immutable and shared (a request keeps its shared_ptr while it computes).
// Not thread-safe: the engine's thread only.

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace crescent::engine {

struct EncoderCacheStats {
  int64_t capacity_tokens = 0;
  int64_t num_tokens_used = 0;  // rows held by entries, referenced or not
  int num_entries = 0;
  int num_referenced = 0;
  int64_t num_hits = 0;    // lookups that found the entry
  int64_t num_misses = 0;  // lookups that had to encode
  int64_t num_evictions = 0;
};

class EncoderCache {
 public:
  using Embeddings = std::shared_ptr<const std::vector<float>>;

  explicit EncoderCache(int64_t capacity_tokens);

  int64_t capacity_tokens() const { return capacity_tokens_; }
  bool contains(const std::string& mm_hash) const { return entries_.contains(mm_hash); }
  // The entry with one more reference, or null (counted as a miss) if absent.
  Embeddings acquire(const std::string& mm_hash);
  // Drops one reference taken by acquire() or insert().
  void release(const std::string& mm_hash);
  // Whether num_tokens more rows fit once every unreferenced entry is evicted.
  bool can_insert(int64_t num_tokens) const;
  // Adds an entry holding one reference, evicting unreferenced entries as needed.
  // Precondition: !contains(mm_hash) and can_insert(num_tokens).
  Embeddings insert(const std::string& mm_hash, Embeddings embeddings, int64_t num_tokens);

  EncoderCacheStats stats() const;

 private:
  struct Entry {
    Embeddings embeddings;
    int64_t num_tokens = 0;
    int ref_count = 0;
    bool in_lru = false;
    std::list<std::string>::iterator lru_pos;
  };
  void evict_one();

  int64_t capacity_tokens_;
  int64_t num_tokens_used_ = 0;
  int64_t num_unreferenced_tokens_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // unreferenced entries, least recently used first
  int64_t num_hits_ = 0;
  int64_t num_misses_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace crescent::engine
