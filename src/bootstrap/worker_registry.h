#pragma once
// The bootstrap server's table of registered workers: which engine owns each dp rank and the
// transfer address of each (dp, tp, pp) worker; and, apart from them, the EPD encoders
// (role "encode": engine id -> EC control listener), which neither take a dp rank nor count
// toward the expected ones. In memory only; entries are never removed (a worker that restarts
// on another address needs a fresh bootstrap server, or a fresh engine id). Thread-safe.

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
  // its engine holds another dp rank, or its (dp, tp, pp) has another addr; for an encoder,
  // its engine id is registered with another addr; and an engine id is either a dp rank's or
  // an encoder's, never both. InvalidArgument when dp_rank >= expected_dp_ranks (dp ranks
  // only); ResourceExhausted past kMaxWorkers (both kinds together).
  Status add(const WorkerRegistration& registration);

  // The whole table once dp ranks 0..expected-1 have all registered; Unavailable listing the
  // missing ranks before that.
  Result<QueryResult> snapshot() const;

  // The encoders registered so far (any number, possibly none).
  EncoderTable encoders() const;

  int expected_dp_ranks() const { return expected_dp_ranks_; }
  int num_workers() const;

  static constexpr int kMaxWorkers = 1 << 16;

 private:
  const int expected_dp_ranks_;
  mutable std::mutex mu_;
  QueryResult table_;                        // GUARDED_BY(mu_)
  std::map<std::string, int> dp_of_engine_;  // GUARDED_BY(mu_)
  EncoderTable encoders_;                    // GUARDED_BY(mu_)
  int num_workers_ = 0;                      // GUARDED_BY(mu_)
};

}  // namespace crescent::bootstrap
