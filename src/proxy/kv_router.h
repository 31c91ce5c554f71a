#pragma once
// --router kv_aware (docs/proxy.md): sends a prompt to the prefill server that already holds
// the longest prefix of its KV, weighed against how busy each one is.
//
// A poller thread reads every prefill's GET /v1/kv_events?since=SEQ&engine_id=ID each
// interval into a bounded KvIndex. An answer with reset = true, a new engine_id, or a failed
// poll first forgets what that prefill held; so does forget() (the registry saw it go down or
// restart), at once. For a request, prompt_hashes() asks one prefill's POST /tokenize with
// "return_block_hashes" for the prompt's block hashes (the chain the workers' events carry),
// and choose() scores each candidate:
//   score = overlap_weight * matched prefix blocks - load_weight * requests in flight
// highest wins, ties go round-robin. Thread-safe.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "proxy/kv_index.h"
#include "proxy/proxy_options.h"

namespace crescent::proxy {

struct RouterWeights {
  double overlap = 1.0;
  double load = 1.0;
};

struct RouteCandidate {
  int matched_blocks = 0;
  int in_flight = 0;
};

// The position in `candidates` (non-empty) of the best score; among equal scores the
// (tie_counter mod number tied)-th.
size_t choose_candidate(std::span<const RouteCandidate> candidates, const RouterWeights& weights,
                        uint64_t tie_counter);

// One prefill's /v1/kv_events answer, parsed.
struct KvEventsAnswer {
  std::string engine_id;
  int64_t seq = 0;
  bool reset = false;
  struct Event {
    std::string type;  // "stored", "removed", "cleared"
    std::vector<uint64_t> hashes;
  };
  std::vector<Event> events;
};
Result<KvEventsAnswer> parse_kv_events(std::string_view body);

class KvRouter {
 public:
  KvRouter(std::vector<PrefillSpec> prefills, RouterWeights weights, int64_t poll_interval_ms,
           size_t max_index_entries);
  ~KvRouter();  // stop()
  KvRouter(const KvRouter&) = delete;
  KvRouter& operator=(const KvRouter&) = delete;

  // Called (on the poller thread, holding no lock of the router's) when prefill `index`'s
  // /v1/kv_events could not be reached at all (refused, reset: kUnavailable): the proxy takes
  // it out of rotation at once rather than at its registry's next refresh, so that a request
  // is not sent to a prefill whose KV the index has just forgotten. A timeout or an error
  // status is not reported: the server is alive. Set before start().
  void set_on_unreachable(std::function<void(int index, const Status& why)> on_unreachable) {
    on_unreachable_ = std::move(on_unreachable);
  }
  void start();
  void stop();  // idempotent

  const RouterWeights& weights() const { return weights_; }

  // Applies one answer from prefill `index` (what the poller does with each).
  void apply(int index, const KvEventsAnswer& answer);
  // Forgets what prefill `index` holds (down, restarted); its next poll starts afresh.
  void forget(int index);
  std::vector<int> matched_prefix(std::span<const uint64_t> hashes) const;
  size_t index_size() const;

  // The prompt's block hashes from prefill `index`'s POST /tokenize (blocking, bounded by
  // timeout_ms). body: the client's completion or chat body.
  Result<std::vector<uint64_t>> prompt_hashes(int index, const nlohmann::json& body,
                                              const std::string& authorization,
                                              int64_t timeout_ms) const;

 private:
  struct Feed {
    std::string engine_id;  // "" until read
    int64_t seq = 0;
  };
  void poll_loop();
  void forget_locked(int index);

  const std::vector<PrefillSpec> prefills_;
  const RouterWeights weights_;
  const int64_t poll_interval_ms_;
  std::function<void(int, const Status&)> on_unreachable_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  KvIndex index_;            // guarded by mu_
  std::vector<Feed> feeds_;  // guarded by mu_
  bool stopping_ = false;    // guarded by mu_
  std::thread thread_;
};

}  // namespace crescent::proxy
