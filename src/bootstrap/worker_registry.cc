#include "bootstrap/worker_registry.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "core/logging.h"

namespace crescent::bootstrap {
namespace {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

bool has_lapsed(double ttl_s, TimePoint expires, TimePoint now) {
  return ttl_s > 0 && now >= expires;
}

}  // namespace

namespace {

WorkerRegistryOptions with_ranks(int expected_dp_ranks) {
  WorkerRegistryOptions o;
  o.expected_dp_ranks = expected_dp_ranks;
  return o;
}

}  // namespace

WorkerRegistry::WorkerRegistry(int expected_dp_ranks)
    : WorkerRegistry(with_ranks(expected_dp_ranks)) {}

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options) : options_(std::move(options)) {
  CRESCENT_CHECK(options_.max_lease_ttl_s > 0);
  CRESCENT_CHECK(options_.now != nullptr);
}

WorkerRegistry::Lease WorkerRegistry::lease_for(const WorkerRegistration& r, TimePoint now) const {
  Lease lease;
  if (r.lease_ttl_s > 0) {
    lease.ttl_s = std::min(r.lease_ttl_s, options_.max_lease_ttl_s);
    lease.expires = now + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(lease.ttl_s));
  }
  return lease;
}

void WorkerRegistry::remove_dp_locked(int dp_rank) {
  auto it = table_.find(dp_rank);
  if (it == table_.end()) {
    return;
  }
  for (const auto& [tp, by_pp] : it->second.worker_addr) {
    num_workers_ -= static_cast<int>(by_pp.size());
  }
  dp_of_engine_.erase(it->second.engine_id);
  dp_leases_.erase(dp_rank);
  table_.erase(it);
}

void WorkerRegistry::expire_locked(TimePoint now) {
  for (auto it = dp_leases_.begin(); it != dp_leases_.end();) {
    const int dp = it->first;
    ++it;  // remove_dp_locked erases the current entry
    const Lease& lease = dp_leases_.at(dp);
    if (has_lapsed(lease.ttl_s, lease.expires, now)) {
      remove_dp_locked(dp);
    }
  }
  for (auto it = encoder_leases_.begin(); it != encoder_leases_.end();) {
    if (has_lapsed(it->second.ttl_s, it->second.expires, now)) {
      encoders_.erase(it->first);
      --num_workers_;
      it = encoder_leases_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<Registered> WorkerRegistry::add(const WorkerRegistration& r) {
  if (!r.role.empty() && r.role != kEncodeRole) {
    return invalid_argument("unknown role " + quoted(r.role));
  }
  if (r.role.empty() && (r.dp_rank < 0 || r.dp_rank >= options_.expected_dp_ranks)) {
    return invalid_argument("dp_rank " + std::to_string(r.dp_rank) + " is outside 0.." +
                            std::to_string(options_.expected_dp_ranks - 1) +
                            " (this bootstrap server expects " +
                            std::to_string(options_.expected_dp_ranks) + " dp rank(s))");
  }
  Probe probe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = options_.now();
    expire_locked(now);
    if (r.role == kEncodeRole) {
      return add_encoder_locked(r, now);
    }
    auto added = add_dp_locked(r, now, nullptr, &probe);
    if (!added.is_ok() || probe.engine_id.empty()) {
      return added;
    }
  }
  // Outside the lock: the probe may take its whole timeout.
  const bool is_alive = options_.is_alive(probe.addr);
  std::lock_guard<std::mutex> lock(mu_);
  const TimePoint now = options_.now();
  expire_locked(now);
  // No second probe: an owner that changed meanwhile is taken to be alive.
  return add_dp_locked(r, now, is_alive ? nullptr : &probe, nullptr);
}

Result<Registered> WorkerRegistry::add_encoder_locked(const WorkerRegistration& r, TimePoint now) {
  if (auto it = dp_of_engine_.find(r.engine_id); it != dp_of_engine_.end()) {
    return already_exists("engine_id " + quoted(r.engine_id) + " is registered at dp_rank " +
                          std::to_string(it->second) + ", not as an encoder");
  }
  const Lease lease = lease_for(r, now);
  if (auto it = encoders_.find(r.engine_id); it != encoders_.end()) {
    if (it->second != r.addr) {
      return already_exists("encoder " + quoted(r.engine_id) + " is registered at " + it->second +
                            ", not " + r.addr);
    }
    encoder_leases_[r.engine_id] = lease;  // identical re-registration: renewed
    return Registered{1, lease.ttl_s, /*is_renewal=*/true};
  }
  if (num_workers_ >= kMaxWorkers) {
    return resource_exhausted("the bootstrap server holds " + std::to_string(kMaxWorkers) +
                              " workers already");
  }
  encoders_[r.engine_id] = r.addr;
  encoder_leases_[r.engine_id] = lease;
  ++num_workers_;
  return Registered{1, lease.ttl_s};
}

Result<Registered> WorkerRegistry::add_dp_locked(const WorkerRegistration& r, TimePoint now,
                                                 const Probe* dead, Probe* probe) {
  if (auto fence = fenced_.find(r.engine_id); fence != fenced_.end()) {
    return failed_precondition(
        "engine_id " + quoted(r.engine_id) + " was fenced: dp_rank " +
        std::to_string(fence->second.dp_rank) + " was taken over by engine_id " +
        quoted(fence->second.by_engine_id) + " at epoch " + std::to_string(fence->second.epoch));
  }
  if (encoders_.count(r.engine_id) != 0) {
    return already_exists("engine_id " + quoted(r.engine_id) + " is registered as an encoder, " +
                          "not at dp_rank " + std::to_string(r.dp_rank));
  }
  if (auto it = dp_of_engine_.find(r.engine_id);
      it != dp_of_engine_.end() && it->second != r.dp_rank) {
    return already_exists("engine_id " + quoted(r.engine_id) + " is registered at dp_rank " +
                          std::to_string(it->second) + ", not dp_rank " +
                          std::to_string(r.dp_rank));
  }
  auto dp_it = table_.find(r.dp_rank);
  if (dp_it != table_.end() && dp_it->second.engine_id != r.engine_id) {
    const DpEntry& owner = dp_it->second;
    // The newcomer registers an address the owner had: the owner no longer listens there.
    bool takes_owner_addr = false;
    std::string owner_addr;
    for (const auto& [tp, by_pp] : owner.worker_addr) {
      for (const auto& [pp, addr] : by_pp) {
        takes_owner_addr = takes_owner_addr || addr == r.addr;
        if (owner_addr.empty()) {
          owner_addr = addr;
        }
      }
    }
    const bool is_dead =
        takes_owner_addr ||
        (dead != nullptr && dead->engine_id == owner.engine_id && dead->epoch == owner.epoch);
    if (!is_dead) {
      if (probe != nullptr && options_.is_alive && !owner_addr.empty()) {
        *probe = Probe{owner.engine_id, owner.epoch, owner_addr};
        return Registered{};
      }
      const Lease& lease = dp_leases_[r.dp_rank];
      const std::string held =
          lease.ttl_s > 0
              ? "its lease runs " +
                    seconds_text(std::chrono::duration<double>(lease.expires - now).count()) +
                    " more"
              : "it holds no lease";
      return already_exists("dp_rank " + std::to_string(r.dp_rank) +
                            " is registered by engine_id " + quoted(owner.engine_id) + ", not " +
                            quoted(r.engine_id) + " (" + held +
                            (options_.is_alive ? " and " + owner_addr + " answers" : "") + ")");
    }
    const uint64_t epoch = dp_epochs_[r.dp_rank] + 1;
    CRESCENT_LOG(kWarn) << "bootstrap: dp_rank " << r.dp_rank << ": engine_id '" << r.engine_id
                        << "' replaces '" << owner.engine_id << "', which is gone ("
                        << (takes_owner_addr ? "its address is registered again"
                                             : owner_addr + " does not answer")
                        << "); epoch " << epoch << ", the old owner is fenced";
    remove_dp_locked(r.dp_rank);
    dp_it = table_.end();
  }
  if (dp_it != table_.end()) {
    auto tp_it = dp_it->second.worker_addr.find(r.tp_rank);
    if (tp_it != dp_it->second.worker_addr.end()) {
      auto pp_it = tp_it->second.find(r.pp_rank);
      if (pp_it != tp_it->second.end()) {
        if (pp_it->second != r.addr) {
          return already_exists("dp_rank " + std::to_string(r.dp_rank) + " tp_rank " +
                                std::to_string(r.tp_rank) + " pp_rank " +
                                std::to_string(r.pp_rank) + " is registered at " + pp_it->second +
                                ", not " + r.addr);
        }
        // Identical re-registration: renews the lease.
        const Lease lease = lease_for(r, now);
        dp_leases_[r.dp_rank] = lease;
        return Registered{dp_it->second.epoch, lease.ttl_s, /*is_renewal=*/true};
      }
    }
  }
  if (num_workers_ >= kMaxWorkers) {
    return resource_exhausted("the bootstrap server holds " + std::to_string(kMaxWorkers) +
                              " workers already");
  }
  if (dp_it == table_.end()) {
    DpEntry& entry = table_[r.dp_rank];
    entry.engine_id = r.engine_id;
    entry.epoch = ++dp_epochs_[r.dp_rank];
    // The previous owner (replaced, or its lease lapsed) may still be running: fenced.
    std::string& last = last_owner_[r.dp_rank];
    if (!last.empty() && last != r.engine_id) {
      if (fenced_.insert_or_assign(last, Fence{r.engine_id, r.dp_rank, entry.epoch}).second) {
        fence_order_.push_back(last);
        if (fence_order_.size() > kMaxFences) {
          fenced_.erase(fence_order_.front());
          fence_order_.pop_front();
        }
      }
    }
    last = r.engine_id;
    dp_it = table_.find(r.dp_rank);
  }
  dp_it->second.worker_addr[r.tp_rank][r.pp_rank] = r.addr;
  dp_of_engine_[r.engine_id] = r.dp_rank;
  const Lease lease = lease_for(r, now);
  dp_leases_[r.dp_rank] = lease;
  ++num_workers_;
  return Registered{dp_it->second.epoch, lease.ttl_s};
}

Result<QueryResult> WorkerRegistry::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(options_.now());
  std::string missing;
  int num_missing = 0;
  for (int dp = 0; dp < options_.expected_dp_ranks; ++dp) {
    if (table_.count(dp) == 0) {
      if (num_missing < 32) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(dp);
      }
      ++num_missing;
    }
  }
  if (num_missing > 0) {
    if (num_missing > 32) {
      missing += ", ... (" + std::to_string(num_missing) + " in all)";
    }
    return unavailable("waiting for dp rank(s) " + missing + " to register (" +
                       std::to_string(options_.expected_dp_ranks - num_missing) + " of " +
                       std::to_string(options_.expected_dp_ranks) + " registered)");
  }
  return table_;
}

EncoderTable WorkerRegistry::encoders() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(options_.now());
  return encoders_;
}

int WorkerRegistry::num_workers() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(options_.now());
  return num_workers_;
}

size_t WorkerRegistry::num_fences() {
  std::lock_guard<std::mutex> lock(mu_);
  return fenced_.size();
}

}  // namespace crescent::bootstrap
