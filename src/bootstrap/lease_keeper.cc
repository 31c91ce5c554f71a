#include "bootstrap/lease_keeper.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/logging.h"

namespace crescent::bootstrap {
namespace {

std::chrono::milliseconds third_of(double ttl_s) {
  return std::chrono::milliseconds(std::max<int64_t>(50, static_cast<int64_t>(ttl_s * 1000 / 3)));
}

}  // namespace

LeaseKeeper::LeaseKeeper(std::string url, WorkerRegistration registration,
                         std::function<void(const std::string& reason)> on_fenced)
    : url_(std::move(url)),
      registration_(std::move(registration)),
      on_fenced_(std::move(on_fenced)) {
  CRESCENT_CHECK(registration_.lease_ttl_s > 0);
  thread_ = std::thread([this] { run(); });
}

LeaseKeeper::~LeaseKeeper() {
  stop();
}

void LeaseKeeper::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

bool LeaseKeeper::is_fenced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return is_fenced_;
}

int64_t LeaseKeeper::num_renewals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_renewals_;
}

void LeaseKeeper::run() {
  std::chrono::milliseconds period = third_of(registration_.lease_ttl_s);
  bool was_failing = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, period, [this] { return is_stopping_; })) {
        return;
      }
    }
    // One renewal may take at most a period, so a slow bootstrap still gets the next one in.
    auto renewed = renew_registration(url_, registration_, Deadline::after(period));
    if (renewed.is_ok() && renewed->is_fenced) {
      CRESCENT_LOG(kError) << "bootstrap: engine '" << registration_.engine_id
                           << "' lost its registration at " << url_ << ": "
                           << renewed->fenced_reason;
      {
        std::lock_guard<std::mutex> lock(mu_);
        is_fenced_ = true;
      }
      if (on_fenced_) {
        on_fenced_(renewed->fenced_reason);
      }
      return;
    }
    if (!renewed.is_ok()) {
      // Said once per outage: the keeper goes on trying every period.
      if (!was_failing) {
        CRESCENT_LOG(kWarn) << "bootstrap: cannot renew the lease of engine '"
                            << registration_.engine_id << "' at " << url_ << " ("
                            << renewed.status().to_string() << "); retrying";
      }
      was_failing = true;
      continue;
    }
    if (was_failing) {
      CRESCENT_LOG(kInfo) << "bootstrap: lease of engine '" << registration_.engine_id
                          << "' renewed at " << url_ << " again";
    }
    was_failing = false;
    if (renewed->granted.lease_ttl_s > 0) {
      period = third_of(std::min(renewed->granted.lease_ttl_s, registration_.lease_ttl_s));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++num_renewals_;
  }
}

}  // namespace crescent::bootstrap
