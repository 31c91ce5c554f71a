#pragma once
// KV cache events: what a worker's prefix cache gained and lost, for a router that sends a
// prompt to the worker already holding its prefix (docs/server.md, GET /v1/kv_events).
//
// The BlockManager records, on the engine's thread, every full block hash it registers
// ("stored"), every cached block it evicts ("removed") and a wipe of the whole cache
// ("cleared"). The log keeps the newest `capacity` events in a ring, numbered from 1, and the
// set of hashes held now, so that a reader whose position fell off the ring (or who never read)
// gets a full snapshot instead (reset = true). HTTP threads read it. Thread-safe.
//
// The hash chain is the block manager's: hash_token_block(parent hash, the block's token ids,
// image key), parent 0 for the first block; prefix_block_hashes() computes it for a prompt
// without images, so that /tokenize can hand a router the keys the worker's events carry.

#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace crescent::engine {

// The 64-bit finalizer (MurmurHash3's fmix64) the chain is built from.
uint64_t mix_hash64(uint64_t z);
uint64_t hash_token_block(uint64_t parent_hash, std::span<const int32_t> token_ids,
                          uint64_t mm_key);
// The chained hashes of the leading full blocks of a text-only prompt (num_tokens / block_size
// of them).
std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> token_ids, int block_size);

enum class KvEventType { kStored, kRemoved, kCleared };
const char* kv_event_type_name(KvEventType type);

struct KvEvent {
  int64_t seq = 0;
  KvEventType type = KvEventType::kStored;
  std::vector<uint64_t> hashes;  // empty for kCleared
};

struct KvEventsPage {
  std::string engine_id;
  int block_size = 0;
  int64_t seq = 0;  // the newest event's number (0: none yet)
  // true: `events` is one "stored" event with every hash held now (numbered `seq`); the reader
  // drops what it knew first.
  bool reset = false;
  std::vector<KvEvent> events;
};

class KvEventLog {
 public:
  // engine_id: changes when the engine restarts (a reader then resets). capacity >= 1 events.
  KvEventLog(std::string engine_id, int block_size, size_t capacity = 4096);

  const std::string& engine_id() const { return engine_id_; }
  int block_size() const { return block_size_; }

  void record_stored(std::vector<uint64_t> hashes);
  void record_removed(uint64_t hash);
  void record_cleared();

  // The events after `since` (a number a previous page returned as seq, or 0 with
  // `engine_id` empty for a first read). A snapshot (reset) when since_engine_id differs from
  // this log's, or events after `since` were dropped from the ring, or since > seq.
  KvEventsPage read_since(const std::string& since_engine_id, int64_t since) const;
  size_t num_held() const;

 private:
  void push_locked(KvEvent event);

  const std::string engine_id_;
  const int block_size_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<KvEvent> ring_;           // guarded by mu_; oldest first
  int64_t next_seq_ = 1;               // guarded by mu_
  std::unordered_set<uint64_t> held_;  // guarded by mu_
};

}  // namespace crescent::engine
