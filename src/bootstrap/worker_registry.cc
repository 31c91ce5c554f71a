#include "bootstrap/worker_registry.h"

#include <string>

namespace crescent::bootstrap {
namespace {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

}  // namespace

WorkerRegistry::WorkerRegistry(int expected_dp_ranks) : expected_dp_ranks_(expected_dp_ranks) {}

Status WorkerRegistry::add(const WorkerRegistration& r) {
  if (r.role == kEncodeRole) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = dp_of_engine_.find(r.engine_id); it != dp_of_engine_.end()) {
      return already_exists("engine_id " + quoted(r.engine_id) + " is registered at dp_rank " +
                            std::to_string(it->second) + ", not as an encoder");
    }
    if (auto it = encoders_.find(r.engine_id); it != encoders_.end()) {
      if (it->second == r.addr) {
        return Status::ok();  // identical re-registration
      }
      return already_exists("encoder " + quoted(r.engine_id) + " is registered at " + it->second +
                            ", not " + r.addr);
    }
    if (num_workers_ >= kMaxWorkers) {
      return resource_exhausted("the bootstrap server holds " + std::to_string(kMaxWorkers) +
                                " workers already");
    }
    encoders_[r.engine_id] = r.addr;
    ++num_workers_;
    return Status::ok();
  }
  if (!r.role.empty()) {
    return invalid_argument("unknown role " + quoted(r.role));
  }
  if (r.dp_rank < 0 || r.dp_rank >= expected_dp_ranks_) {
    return invalid_argument("dp_rank " + std::to_string(r.dp_rank) + " is outside 0.." +
                            std::to_string(expected_dp_ranks_ - 1) +
                            " (this bootstrap server expects " +
                            std::to_string(expected_dp_ranks_) + " dp rank(s))");
  }
  std::lock_guard<std::mutex> lock(mu_);
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
    return already_exists("dp_rank " + std::to_string(r.dp_rank) + " is registered by engine_id " +
                          quoted(dp_it->second.engine_id) + ", not " + quoted(r.engine_id));
  }
  if (dp_it != table_.end()) {
    auto tp_it = dp_it->second.worker_addr.find(r.tp_rank);
    if (tp_it != dp_it->second.worker_addr.end()) {
      auto pp_it = tp_it->second.find(r.pp_rank);
      if (pp_it != tp_it->second.end()) {
        if (pp_it->second == r.addr) {
          return Status::ok();  // identical re-registration
        }
        return already_exists("dp_rank " + std::to_string(r.dp_rank) + " tp_rank " +
                              std::to_string(r.tp_rank) + " pp_rank " + std::to_string(r.pp_rank) +
                              " is registered at " + pp_it->second + ", not " + r.addr);
      }
    }
  }
  if (num_workers_ >= kMaxWorkers) {
    return resource_exhausted("the bootstrap server holds " + std::to_string(kMaxWorkers) +
                              " workers already");
  }
  DpEntry& entry = table_[r.dp_rank];
  entry.engine_id = r.engine_id;
  entry.worker_addr[r.tp_rank][r.pp_rank] = r.addr;
  dp_of_engine_[r.engine_id] = r.dp_rank;
  ++num_workers_;
  return Status::ok();
}

Result<QueryResult> WorkerRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string missing;
  int num_missing = 0;
  for (int dp = 0; dp < expected_dp_ranks_; ++dp) {
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
                       std::to_string(expected_dp_ranks_ - num_missing) + " of " +
                       std::to_string(expected_dp_ranks_) + " registered)");
  }
  return table_;
}

EncoderTable WorkerRegistry::encoders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return encoders_;
}

int WorkerRegistry::num_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_workers_;
}

}  // namespace crescent::bootstrap
