#include "engine/kv_events.h"

#include "core/check.h"

namespace crescent::engine {

uint64_t mix_hash64(uint64_t z) {
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
  z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return z ^ (z >> 33);
}

uint64_t hash_token_block(uint64_t parent_hash, std::span<const int32_t> token_ids,
                          uint64_t mm_key) {
  uint64_t h = mix_hash64(parent_hash ^ 0x6a09e667f3bcc908ULL);
  for (int32_t t : token_ids) {
    h = mix_hash64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) * 0x9e3779b97f4a7c15ULL));
  }
  if (mm_key != 0) {
    h = mix_hash64(h ^ mm_key ^ 0xbb67ae8584caa73bULL);
  }
  return h;
}

std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> token_ids, int block_size) {
  CRESCENT_CHECK(block_size > 0) << block_size;
  std::vector<uint64_t> out;
  uint64_t parent = 0;
  for (size_t begin = 0; begin + static_cast<size_t>(block_size) <= token_ids.size();
       begin += static_cast<size_t>(block_size)) {
    parent = hash_token_block(parent, token_ids.subspan(begin, static_cast<size_t>(block_size)), 0);
    out.push_back(parent);
  }
  return out;
}

const char* kv_event_type_name(KvEventType type) {
  switch (type) {
    case KvEventType::kStored:
      return "stored";
    case KvEventType::kRemoved:
      return "removed";
    case KvEventType::kCleared:
      return "cleared";
  }
  return "?";
}

KvEventLog::KvEventLog(std::string engine_id, int block_size, size_t capacity)
    : engine_id_(std::move(engine_id)), block_size_(block_size), capacity_(capacity) {
  CRESCENT_CHECK(capacity_ >= 1 && block_size_ > 0) << capacity_ << " " << block_size_;
}

void KvEventLog::push_locked(KvEvent event) {
  event.seq = next_seq_++;
  ring_.push_back(std::move(event));
  while (ring_.size() > capacity_) {
    ring_.pop_front();
  }
}

void KvEventLog::record_stored(std::vector<uint64_t> hashes) {
  if (hashes.empty()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  held_.insert(hashes.begin(), hashes.end());
  push_locked({.seq = 0, .type = KvEventType::kStored, .hashes = std::move(hashes)});
}

void KvEventLog::record_removed(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(hash);
  push_locked({.seq = 0, .type = KvEventType::kRemoved, .hashes = {hash}});
}

void KvEventLog::record_cleared() {
  std::lock_guard<std::mutex> lock(mu_);
  held_.clear();
  push_locked({.seq = 0, .type = KvEventType::kCleared, .hashes = {}});
}

size_t KvEventLog::num_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

KvEventsPage KvEventLog::read_since(const std::string& since_engine_id, int64_t since) const {
  std::lock_guard<std::mutex> lock(mu_);
  KvEventsPage page;
  page.engine_id = engine_id_;
  page.block_size = block_size_;
  page.seq = next_seq_ - 1;
  // The ring holds every event after `since` when its first one is at most since + 1.
  const int64_t first_kept = ring_.empty() ? next_seq_ : ring_.front().seq;
  const bool covered =
      since_engine_id == engine_id_ && since >= 0 && since <= page.seq && first_kept <= since + 1;
  if (!covered) {
    page.reset = true;
    KvEvent snapshot{.seq = page.seq, .type = KvEventType::kStored, .hashes = {}};
    snapshot.hashes.assign(held_.begin(), held_.end());
    page.events.push_back(std::move(snapshot));
    return page;
  }
  for (const KvEvent& e : ring_) {
    if (e.seq > since) {
      page.events.push_back(e);
    }
  }
  return page;
}

}  // namespace crescent::engine
