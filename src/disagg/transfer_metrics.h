#pragma once
// The connector's counters and histograms (Prometheus families crescent_kv_transfer_*), by
// role: "prefill" (this engine wrote KV into a decode engine) and "decode" (this engine
// fetched KV). Thread-safe: every method takes the internal lock.

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/prometheus.h"

namespace crescent::disagg {

enum class TransferRole { kPrefill = 0, kDecode = 1 };
// kNotNeeded: the decode engine's own prefix cache covered the prompt (NOT_NEEDED sent or
// received); such a transfer never moves bytes. kPeerLost: the prefill engine freed the blocks at
// once because the decode engine it held them for is gone (control connection closed, or its
// heartbeats missed), instead of at the deadline.
enum class TransferResult {
  kOk = 0,
  kError = 1,
  kCancelled = 2,
  kExpired = 3,
  kNotNeeded = 4,
  kPeerLost = 5
};
inline constexpr int kNumTransferResults = 6;

struct RoleCountsSnapshot {
  uint64_t num_ok = 0;
  uint64_t num_error = 0;
  uint64_t num_cancelled = 0;
  uint64_t num_expired = 0;
  uint64_t num_not_needed = 0;
  uint64_t num_peer_lost = 0;
  uint64_t num_bytes = 0;
  int64_t num_in_flight = 0;
  uint64_t num_write_latency_samples = 0;
};

// One decode-side fetch, for the time-to-first-token breakdown.
struct FetchTiming {
  std::string request_id;
  std::string transfer_id;
  double bootstrap_s = 0;  // resolve (0 when cached)
  double wait_s = 0;       // ASK sent -> the prefill engine starts writing
  double transfer_s = 0;   // the prefill engine's write (reported in DONE)
  double total_s = 0;      // start_remote_prefill -> kRemoteKvReady
  uint64_t num_bytes = 0;
  bool is_ok = false;
};

struct KvTransferMetricsSnapshot {
  RoleCountsSnapshot prefill;
  RoleCountsSnapshot decode;
  std::vector<FetchTiming> recent_fetches;  // the last kNumRecentFetches, oldest first
};

class TransferMetrics {
 public:
  static constexpr size_t kNumRecentFetches = 64;
  TransferMetrics();

  void add_in_flight(TransferRole role, int delta);
  void count_result(TransferRole role, TransferResult result);
  void add_bytes(TransferRole role, uint64_t num_bytes);
  void observe_write(TransferRole role, double seconds);
  // Decode side: one finished fetch (ok or not); phase histograms take ok fetches only.
  void record_fetch(const FetchTiming& timing);

  KvTransferMetricsSnapshot snapshot() const;
  void render(std::string* out) const;

 private:
  struct PerRole {
    uint64_t num_by_result[kNumTransferResults] = {};
    uint64_t num_bytes = 0;
    int64_t num_in_flight = 0;
    prometheus::Histogram write_seconds;
  };
  mutable std::mutex mu_;
  PerRole roles_[2];                         // GUARDED_BY(mu_)
  prometheus::Histogram bootstrap_seconds_;  // GUARDED_BY(mu_)
  prometheus::Histogram wait_seconds_;       // GUARDED_BY(mu_)
  prometheus::Histogram transfer_seconds_;   // GUARDED_BY(mu_)
  prometheus::Histogram fetch_seconds_;      // GUARDED_BY(mu_)
  std::deque<FetchTiming> recent_;           // GUARDED_BY(mu_)
};

}  // namespace crescent::disagg
