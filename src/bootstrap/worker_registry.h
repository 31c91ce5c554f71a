#pragma once
// The bootstrap server's table of registered workers: which engine owns each dp rank and the
// transfer address of each (dp, tp, pp) worker. In memory only; entries are never removed
// (a worker that restarts on another address needs a fresh bootstrap server). Thread-safe.

#include <map>
#include <mutex>
#include <string>

#include "bootstrap/bootstrap_client.h"
#include "core/status.h"

namespace crescent::bootstrap {

class WorkerRegistry {
 public:
  explicit WorkerRegistry(int expected_dp_ranks);

  // Adds a validated registration (see wire.h). OK when new or identical to an existing one.
  // AlreadyExists naming both values when it conflicts: its dp rank belongs to another engine,
  // its engine holds another dp rank, or its (dp, tp, pp) has another addr.
  // InvalidArgument when dp_rank >= expected_dp_ranks; ResourceExhausted past kMaxWorkers.
  Status add(const WorkerRegistration& registration);

  // The whole table once dp ranks 0..expected-1 have all registered; Unavailable listing the
  // missing ranks before that.
  Result<QueryResult> snapshot() const;

  int expected_dp_ranks() const { return expected_dp_ranks_; }
  int num_workers() const;

  static constexpr int kMaxWorkers = 1 << 16;

 private:
  const int expected_dp_ranks_;
  mutable std::mutex mu_;
  QueryResult table_;                        // GUARDED_BY(mu_)
  std::map<std::string, int> dp_of_engine_;  // GUARDED_BY(mu_)
  int num_workers_ = 0;                      // GUARDED_BY(mu_)
};

}  // namespace crescent::bootstrap
