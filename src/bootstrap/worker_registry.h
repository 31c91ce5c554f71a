#pragma once
// The bootstrap server's table of registered workers: which engine owns each dp rank and the
// transfer address of each (dp, tp, pp) worker; and, apart from them, the EPD encoders
// (role "encode": engine id -> EC control listener), which neither take a dp rank nor count
// toward the expected ones. In memory only. Thread-safe.
//
// Leases (docs/bootstrap.md): a registration that asks for a lease (lease_ttl_s > 0) holds it
// for that long after its last (re-)registration; an entry whose lease lapsed is removed. A
// registration without one (vLLM's workers) never expires. Each dp rank counts epochs: the
// first owner gets 1 and every replacement adds one. A newcomer (another engine id) replaces
// a dp rank's owner that is gone: its lease lapsed, or the probe finds nothing answering at
// its address (or the newcomer registers the very address the owner had, which a live owner
// would still hold). The previous owner of a dp rank that another engine took (replaced, or
// after its lease lapsed) is fenced: its later registrations are refused (FailedPrecondition
// naming the new owner and epoch) so that it stops serving.

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "bootstrap/bootstrap_client.h"
#include "core/clock.h"
#include "core/status.h"

namespace crescent::bootstrap {

struct WorkerRegistryOptions {
  int expected_dp_ranks = 1;
  // Longest lease granted; a registration asking for more gets this (> 0).
  double max_lease_ttl_s = 10;
  // The clock leases run on (a fake one in tests).
  std::function<TimePoint()> now = [] { return Clock::now(); };
  // True when something answers at a worker's "tcp://host:port". Called without the lock,
  // only when a newcomer conflicts with a live lease-less or leased owner. Null: every owner
  // is taken to be alive (conflicts are always refused).
  std::function<bool(const std::string& addr)> is_alive;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(int expected_dp_ranks);
  explicit WorkerRegistry(WorkerRegistryOptions options);

  // Adds or renews a validated registration (see wire.h) and answers its epoch and granted
  // lease. OK when new, identical to an existing one (which renews its lease), or replacing
  // an owner that is gone. AlreadyExists naming both values when it conflicts with a live
  // owner: its dp rank belongs to another engine, its engine holds another dp rank, or its
  // (dp, tp, pp) has another addr; for an encoder, its engine id is registered with another
  // addr; and an engine id is either a dp rank's or an encoder's, never both.
  // FailedPrecondition when the engine was fenced (replaced by another). InvalidArgument when
  // dp_rank >= expected_dp_ranks (dp ranks only); ResourceExhausted past kMaxWorkers.
  Result<Registered> add(const WorkerRegistration& registration);

  // The whole table (lapsed leases removed) once dp ranks 0..expected-1 have all registered;
  // Unavailable listing the missing ranks before that.
  Result<QueryResult> snapshot();

  // The encoders registered so far whose leases hold (any number, possibly none).
  EncoderTable encoders();

  int expected_dp_ranks() const { return options_.expected_dp_ranks; }
  int num_workers();
  size_t num_fences();

  static constexpr int kMaxWorkers = 1 << 16;
  // Fences kept: past this many the oldest is forgotten, so a bootstrap that outlives years of
  // worker restarts does not grow. A forgotten engine that comes back still cannot take a dp
  // rank from a live owner (AlreadyExists); it can only take one that is free again.
  static constexpr size_t kMaxFences = 4096;

 private:
  struct Lease {
    double ttl_s = 0;  // 0: never expires
    TimePoint expires;
  };
  // An owner that must be probed before the newcomer may replace it.
  struct Probe {
    std::string engine_id;
    uint64_t epoch = 0;
    std::string addr;
  };
  struct Fence {
    std::string by_engine_id;
    int dp_rank = 0;
    uint64_t epoch = 0;
  };

  Lease lease_for(const WorkerRegistration& r, TimePoint now) const;
  // Under mu_: drops every entry whose lease lapsed.
  void expire_locked(TimePoint now);
  // Under mu_: removes dp rank's owner (and its workers).
  void remove_dp_locked(int dp_rank);
  Result<Registered> add_encoder_locked(const WorkerRegistration& r, TimePoint now);
  // Under mu_. `dead`: an owner the probe found gone (replaced if it still owns the rank at
  // that epoch). Sets *probe (and returns OK) when the owner must be probed first; with a
  // null `probe` a conflicting owner is taken to be alive.
  Result<Registered> add_dp_locked(const WorkerRegistration& r, TimePoint now, const Probe* dead,
                                   Probe* probe);

  const WorkerRegistryOptions options_;
  std::mutex mu_;
  QueryResult table_;                        // GUARDED_BY(mu_)
  std::map<int, Lease> dp_leases_;           // by dp rank; GUARDED_BY(mu_)
  std::map<int, uint64_t> dp_epochs_;        // last epoch handed out per dp rank; GUARDED_BY(mu_)
  std::map<std::string, int> dp_of_engine_;  // GUARDED_BY(mu_)
  std::map<int, std::string> last_owner_;    // by dp rank, kept past removal; GUARDED_BY(mu_)
  std::map<std::string, Fence> fenced_;      // replaced engine ids; GUARDED_BY(mu_)
  std::deque<std::string> fence_order_;      // fenced_'s keys, oldest first; GUARDED_BY(mu_)
  EncoderTable encoders_;                    // GUARDED_BY(mu_)
  std::map<std::string, Lease> encoder_leases_;  // GUARDED_BY(mu_)
  int num_workers_ = 0;                          // GUARDED_BY(mu_)
};

}  // namespace crescent::bootstrap
