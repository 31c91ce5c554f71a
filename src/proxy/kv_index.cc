#include "proxy/kv_index.h"

#include "core/check.h"

namespace crescent::proxy {
namespace {

uint64_t bit(int upstream) {
  CRESCENT_CHECK(upstream >= 0 && upstream < KvIndex::kMaxUpstreams) << upstream;
  return uint64_t{1} << upstream;
}

}  // namespace

KvIndex::KvIndex(size_t max_entries) : max_entries_(max_entries) {
  CRESCENT_CHECK(max_entries_ >= 1) << max_entries_;
}

void KvIndex::erase(std::unordered_map<uint64_t, Entry>::iterator it) {
  by_age_.erase(it->second.age);
  entries_.erase(it);
}

void KvIndex::store(int upstream, std::span<const uint64_t> hashes) {
  const uint64_t b = bit(upstream);
  for (uint64_t h : hashes) {
    auto it = entries_.find(h);
    if (it != entries_.end()) {
      it->second.holders |= b;
      by_age_.splice(by_age_.end(), by_age_, it->second.age);  // newest again
      continue;
    }
    by_age_.push_back(h);
    entries_.emplace(h, Entry{.holders = b, .age = std::prev(by_age_.end())});
    while (entries_.size() > max_entries_) {
      erase(entries_.find(by_age_.front()));
      ++num_dropped_;
    }
  }
}

void KvIndex::remove(int upstream, std::span<const uint64_t> hashes) {
  const uint64_t b = bit(upstream);
  for (uint64_t h : hashes) {
    auto it = entries_.find(h);
    if (it == entries_.end()) {
      continue;
    }
    it->second.holders &= ~b;
    if (it->second.holders == 0) {
      erase(it);
    }
  }
}

void KvIndex::clear(int upstream) {
  const uint64_t b = bit(upstream);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    it->second.holders &= ~b;
    if (it->second.holders == 0) {
      erase(it);
    }
    it = next;
  }
}

std::vector<int> KvIndex::matched_prefix(std::span<const uint64_t> hashes,
                                         int num_upstreams) const {
  std::vector<int> matched(static_cast<size_t>(num_upstreams), 0);
  uint64_t still =
      num_upstreams >= kMaxUpstreams ? ~uint64_t{0} : (uint64_t{1} << num_upstreams) - 1;
  for (size_t i = 0; i < hashes.size() && still != 0; ++i) {
    auto it = entries_.find(hashes[i]);
    still &= it == entries_.end() ? 0 : it->second.holders;
    for (int u = 0; u < num_upstreams; ++u) {
      if ((still >> u) & 1) {
        matched[static_cast<size_t>(u)] = static_cast<int>(i) + 1;
      }
    }
  }
  return matched;
}

}  // namespace crescent::proxy
