#include "disagg/transfer_metrics.h"

namespace crescent::disagg {
namespace {

const char* role_name(int role) {
  return role == static_cast<int>(TransferRole::kPrefill) ? "prefill" : "decode";
}

const char* result_name(int result) {
  static const char* kNames[] = {"ok", "error", "cancelled", "expired", "not_needed", "peer_lost"};
  return kNames[result];
}

}  // namespace

TransferMetrics::TransferMetrics()
    : roles_{{{}, 0, 0, prometheus::Histogram(prometheus::latency_buckets_seconds())},
             {{}, 0, 0, prometheus::Histogram(prometheus::latency_buckets_seconds())}},
      bootstrap_seconds_(prometheus::latency_buckets_seconds()),
      wait_seconds_(prometheus::latency_buckets_seconds()),
      transfer_seconds_(prometheus::latency_buckets_seconds()),
      fetch_seconds_(prometheus::latency_buckets_seconds()) {}

void TransferMetrics::add_in_flight(TransferRole role, int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  roles_[static_cast<int>(role)].num_in_flight += delta;
}

void TransferMetrics::count_result(TransferRole role, TransferResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  ++roles_[static_cast<int>(role)].num_by_result[static_cast<int>(result)];
}

void TransferMetrics::add_bytes(TransferRole role, uint64_t num_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  roles_[static_cast<int>(role)].num_bytes += num_bytes;
}

void TransferMetrics::observe_write(TransferRole role, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  roles_[static_cast<int>(role)].write_seconds.observe(seconds);
}

void TransferMetrics::record_fetch(const FetchTiming& timing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (timing.is_ok) {
    bootstrap_seconds_.observe(timing.bootstrap_s);
    wait_seconds_.observe(timing.wait_s);
    transfer_seconds_.observe(timing.transfer_s);
    fetch_seconds_.observe(timing.total_s);
  }
  recent_.push_back(timing);
  while (recent_.size() > kNumRecentFetches) {
    recent_.pop_front();
  }
}

KvTransferMetricsSnapshot TransferMetrics::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTransferMetricsSnapshot s;
  RoleCountsSnapshot* out[2] = {&s.prefill, &s.decode};
  for (int r = 0; r < 2; ++r) {
    const PerRole& p = roles_[r];
    out[r]->num_ok = p.num_by_result[0];
    out[r]->num_error = p.num_by_result[1];
    out[r]->num_cancelled = p.num_by_result[2];
    out[r]->num_expired = p.num_by_result[3];
    out[r]->num_not_needed = p.num_by_result[4];
    out[r]->num_peer_lost = p.num_by_result[5];
    out[r]->num_bytes = p.num_bytes;
    out[r]->num_in_flight = p.num_in_flight;
    out[r]->num_write_latency_samples = p.write_seconds.count();
  }
  s.recent_fetches.assign(recent_.begin(), recent_.end());
  return s;
}

void TransferMetrics::render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = "crescent_kv_transfer_";
  prometheus::append_header(out, p + "transfers_total", "counter",
                            "KV transfers that ended, by role and result.");
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < kNumTransferResults; ++k) {
      prometheus::append_sample(
          out,
          p + "transfers_total{role=\"" + role_name(r) + "\",result=\"" + result_name(k) + "\"}",
          static_cast<double>(roles_[r].num_by_result[k]));
    }
  }
  prometheus::append_header(out, p + "bytes_total", "counter",
                            "KV bytes written (prefill) or received (decode).");
  for (int r = 0; r < 2; ++r) {
    prometheus::append_sample(out, p + "bytes_total{role=\"" + std::string(role_name(r)) + "\"}",
                              static_cast<double>(roles_[r].num_bytes));
  }
  prometheus::append_header(out, p + "in_flight", "gauge", "KV transfers in progress.");
  for (int r = 0; r < 2; ++r) {
    prometheus::append_sample(out, p + "in_flight{role=\"" + std::string(role_name(r)) + "\"}",
                              static_cast<double>(roles_[r].num_in_flight));
  }
  prometheus::append_header(
      out, p + "write_seconds", "histogram",
      "Duration of the prefill engine's write of one transfer (decode: as reported in DONE).");
  for (int r = 0; r < 2; ++r) {
    roles_[r].write_seconds.render(p + "write_seconds",
                                   "role=\"" + std::string(role_name(r)) + "\"", out);
  }
  prometheus::append_header(out, p + "bootstrap_seconds", "histogram",
                            "Decode side: bootstrap lookup of the prefill worker (0 if cached).");
  bootstrap_seconds_.render(p + "bootstrap_seconds", out);
  prometheus::append_header(
      out, p + "wait_seconds", "histogram",
      "Decode side: ASK sent until the prefill engine starts writing (its prefill + queueing).");
  wait_seconds_.render(p + "wait_seconds", out);
  prometheus::append_header(out, p + "transfer_seconds", "histogram",
                            "Decode side: the prefill engine's write, as reported in DONE.");
  transfer_seconds_.render(p + "transfer_seconds", out);
  prometheus::append_header(out, p + "fetch_seconds", "histogram",
                            "Decode side: start of the fetch until the KV is ready.");
  fetch_seconds_.render(p + "fetch_seconds", out);
}

}  // namespace crescent::disagg
