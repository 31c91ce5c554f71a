#pragma once
// Which prefill servers are ready, and the round-robin over their (prefill, dp rank) pairs.
//
// One background thread per prefill polls its /health, then its bootstrap server's /query
// (every poll interval) until both answer, learning dp_size and the engine id of each dp
// rank. The proxy is ready when every prefill has been ready once.
//
// A ready prefill is polled the same way every refresh interval: new engine ids (a restart)
// are followed, and a prefill whose poll fails (or that a request could not reach,
// report_unreachable) is "down": the round-robin skips it while
// another prefill is up (if all are down, it uses them all, so that requests fail with an
// error naming the prefill rather than a 503).
//
// Prefills can join and leave at run time (`--discover`, discovery.h): add() starts polling one
// (it enters the rotation once it answers; it does not hold up readiness, which waits only for
// the prefills given at construction), remove() takes it out at once. Indices are never reused
// for another prefill, so an index a request in flight holds stays valid.
//
// Thread-safe.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"
#include "proxy/proxy_options.h"
#include "proxy/request_rewrite.h"

namespace crescent::proxy {

// Engine ids by dp rank (index), from a bootstrap /query answer
// {"<dp_rank>": {"engine_id": "...", "worker_addr": {...}}, ...}. The ranks must be 0..n-1.
Result<std::vector<std::string>> parse_bootstrap_query(std::string_view body);

struct PrefillStatus {
  std::string url;
  bool is_ready = false;    // has answered once
  bool is_up = false;       // its last poll answered
  int dp_size = 0;          // 0 until ready
  std::string waiting_for;  // why it is not ready or up ("" when up)
};

// A chosen prefill: its index in the options and where a decode server gets its KV from.
struct PrefillPick {
  int prefill_index = 0;
  PrefillSource source;
};

class PrefillRegistry {
 public:
  PrefillRegistry(std::vector<PrefillSpec> prefills, int64_t poll_interval_ms,
                  int64_t refresh_interval_ms);
  ~PrefillRegistry();  // stop()
  PrefillRegistry(const PrefillRegistry&) = delete;
  PrefillRegistry& operator=(const PrefillRegistry&) = delete;

  // Called (under the registry's lock: it must not call back) with the index of a ready prefill
  // that went down (poll failed, report_unreachable) or came back with new engine ids. Set
  // before start().
  void set_on_lost(std::function<void(int index)> on_lost) { on_lost_ = std::move(on_lost); }
  // Starts the pollers. Call once.
  void start();
  // Stops and joins the pollers (each wakes at once; an HTTP call in progress ends within
  // its 2 s deadline). Idempotent.
  void stop();

  // A prefill that joined: its index. One already known (same url and bootstrap) keeps its
  // index. Polled from now on (also before start(): its poller starts with the others).
  int add(PrefillSpec spec);
  // A prefill that left: out of the rotation and statuses at once; its poller ends.
  void remove(int index);
  // The index of a known prefill (url and bootstrap address), member or not.
  std::optional<int> find(const PrefillSpec& spec) const;
  // The prefill at `index` (any index add() or the constructor gave).
  PrefillSpec spec(int index) const;

  // Every prefill given at construction has been ready, and one that is a member is ready.
  bool is_ready() const;
  // "" when ready; else what is awaited, naming the first prefill that is not ready.
  std::string waiting_for() const;
  // The next (prefill, dp rank) pair, round-robin in order over the prefills that are up;
  // nullopt while not every prefill is ready.
  std::optional<PrefillPick> next();
  // Every (prefill, dp rank) pair next() rotates over now; empty while not ready.
  std::vector<PrefillPick> picks() const;
  std::vector<PrefillStatus> statuses() const;
  // A call to prefill `index` got no answer at all (refused, reset, connect timeout): it is
  // down at once, as if its poll had failed, until its next poll (refresh interval) answers.
  void report_unreachable(int index, const std::string& why);
  // Something suggests prefill `index` may be gone without proving it (a decode half failed
  // while its prefill half was still waiting): its poller polls it now instead of at its next
  // refresh, at most every kMinRequestedPollGapMs, and a failed poll takes it out as usual.
  void poll_soon(int index);
  static constexpr int64_t kMinRequestedPollGapMs = 100;

 private:
  struct Entry {
    PrefillSpec spec;
    bool is_ready = false;
    bool is_up = false;
    std::vector<std::string> engine_ids;  // by dp rank
    std::string waiting_for;
    bool is_member = true;
    bool is_poll_requested = false;  // poll_soon(): the poller's sleep ends early
    bool is_discovered = false;      // added by add(): readiness does not wait for it
    bool has_poller = false;         // its poll_loop runs (or is about to)
  };
  // Starts index's poller unless one runs. Under mu_.
  void start_poller_locked(int index);
  void poll_loop(int index);
  void rebuild_table_locked();
  // Sleeps up to ms; false when stopping.
  // Sleeps up to ms (less when poll_soon() asks, but at least kMinRequestedPollGapMs); false
  // when stopping.
  bool sleep_ms(int index, int64_t ms);

  const int64_t poll_interval_ms_;
  const int64_t refresh_interval_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_;        // guarded by mu_
  std::vector<PrefillPick> table_;    // guarded by mu_; empty unless all are ready
  bool is_ready_ = false;             // guarded by mu_; every prefill has been ready
  uint64_t next_pick_ = 0;            // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  bool started_ = false;              // guarded by mu_
  std::vector<std::thread> threads_;  // guarded by mu_; by index (a poller at most each)
  std::function<void(int index)> on_lost_;
};

}  // namespace crescent::proxy
