#pragma once
// The proxy's KV index for --router kv_aware: which prefill servers hold which prefix-cache
// block hashes, fed by the servers' GET /v1/kv_events (docs/server.md). A hash maps to the set
// of prefills (bit i: the prefill at index i of --prefill, so at most kMaxUpstreams) that
// reported it stored and not yet removed.
//
// Bounded: at most max_entries hashes; storing one more drops the hash stored longest ago (an
// index that forgets a block only costs a worse routing decision, never a wrong answer).
// Not thread-safe (KvRouter locks it).

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace crescent::proxy {

class KvIndex {
 public:
  static constexpr int kMaxUpstreams = 64;

  explicit KvIndex(size_t max_entries);

  void store(int upstream, std::span<const uint64_t> hashes);
  void remove(int upstream, std::span<const uint64_t> hashes);
  // Forgets everything `upstream` holds (cleared, reset, down or restarted).
  void clear(int upstream);

  // For each upstream 0..num_upstreams-1, how many of `hashes` (a prompt's chained block
  // hashes, first block first) it holds as an unbroken prefix.
  std::vector<int> matched_prefix(std::span<const uint64_t> hashes, int num_upstreams) const;

  size_t size() const { return entries_.size(); }
  size_t max_entries() const { return max_entries_; }
  int64_t num_dropped() const { return num_dropped_; }  // by the bound

 private:
  struct Entry {
    uint64_t holders = 0;  // bit i: upstream i
    std::list<uint64_t>::iterator age;
  };
  void erase(std::unordered_map<uint64_t, Entry>::iterator it);

  const size_t max_entries_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> by_age_;  // oldest store first
  int64_t num_dropped_ = 0;
};

}  // namespace crescent::proxy
