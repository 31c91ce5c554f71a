#pragma once
// The proxy's /metrics in the Prometheus text format (0.0.4): requests by endpoint and
// outcome, requests in flight, upstream errors by side, time to first byte and prefill time
// histograms, and each prefill's readiness. Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/prometheus.h"
#include "proxy/prefill_registry.h"

namespace crescent::proxy {

enum class ApiEndpoint { kCompletions, kChatCompletions, kModels, kCount };

enum class Outcome {
  kOk,                  // the upstream's successful answer reached the client
  kBadRequest,          // refused by the proxy itself (bad body, bad or busy X-Request-Id)
  kNotReady,            // 503 while prefills are not ready
  kPrefillError,        // the prefill failed before the decode server produced anything
  kDecodeError,         // the decode server failed or answered an error
  kTimeout,             // --request-timeout passed
  kClientDisconnected,  // the client went away first
  kCount
};

enum class UpstreamSide { kPrefill, kDecode };

class ProxyMetrics {
 public:
  ProxyMetrics();

  void count_request(ApiEndpoint endpoint, Outcome outcome);
  void add_in_flight(int delta) { num_in_flight_.fetch_add(delta); }
  int num_in_flight() const { return num_in_flight_.load(); }
  void count_upstream_error(UpstreamSide side);
  // Seconds from the client's request to the first byte of the answer sent to it.
  void observe_time_to_first_byte(double seconds);
  // Seconds from the client's request to the prefill server's (successful) answer.
  void observe_prefill(double seconds);

  std::string render(const std::vector<PrefillStatus>& prefills) const;

 private:
  mutable std::mutex mu_;
  std::array<std::array<uint64_t, static_cast<size_t>(Outcome::kCount)>,
             static_cast<size_t>(ApiEndpoint::kCount)>
      requests_{};                             // guarded by mu_
  std::array<uint64_t, 2> upstream_errors_{};  // guarded by mu_
  prometheus::Histogram time_to_first_byte_;   // guarded by mu_
  prometheus::Histogram prefill_;              // guarded by mu_
  std::atomic<int> num_in_flight_{0};
};

}  // namespace crescent::proxy
