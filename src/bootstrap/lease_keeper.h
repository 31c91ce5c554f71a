#pragma once
// LeaseKeeper: keeps one worker's registration alive. A thread re-sends the registration
// every lease_ttl/3 (of the lease the bootstrap granted) until stop(); a bootstrap that is
// unreachable for a while is retried on the same period (and a restarted bootstrap gets the
// registration back). When the bootstrap answers that this engine was fenced (another engine
// replaced it, docs/bootstrap.md), on_fenced runs once with the reason and the keeper stops.
// Thread-safe; the destructor stops and joins.

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "bootstrap/bootstrap_client.h"

namespace crescent::bootstrap {

class LeaseKeeper {
 public:
  // registration.lease_ttl_s must be > 0 (CHECKed). The first renewal goes out a third of the
  // ttl from now: call after the first registration succeeded.
  LeaseKeeper(std::string url, WorkerRegistration registration,
              std::function<void(const std::string& reason)> on_fenced);
  ~LeaseKeeper();  // stop()
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Ends the thread (an in-flight renewal is bounded by its own deadline). Idempotent.
  void stop();
  bool is_fenced() const;
  int64_t num_renewals() const;  // successful ones (for tests)

 private:
  void run();

  const std::string url_;
  const WorkerRegistration registration_;
  const std::function<void(const std::string&)> on_fenced_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopping_ = false;  // GUARDED_BY(mu_)
  bool is_fenced_ = false;    // GUARDED_BY(mu_)
  int64_t num_renewals_ = 0;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace crescent::bootstrap
