#pragma once
// The proxy's /metrics in the Prometheus text format (0.0.4): requests by endpoint and
// outcome, requests in flight, upstream errors by side, time to first byte and prefill time
// histograms, each prefill's readiness, whether each decode server is in rotation and how often
// it was ejected (upstream_health.h), and the encoder stage (calls and failures per encoder,
// encode time, images routed by affinity). Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/prometheus.h"
#include "proxy/prefill_registry.h"
#include "proxy/upstream_health.h"

namespace crescent::proxy {

enum class ApiEndpoint { kCompletions, kChatCompletions, kModels, kTokenize, kDetokenize, kCount };

enum class Outcome {
  kOk,                  // the upstream's successful answer reached the client
  kBadRequest,          // refused by the proxy itself (bad body, bad or busy X-Request-Id)
  kNotReady,            // 503: prefills not ready, or no decode server in rotation
  kPrefillError,        // the prefill failed before the decode server produced anything
  kDecodeError,         // the decode server failed or answered an error
  kTimeout,             // --request-timeout passed
  kClientDisconnected,  // the client went away first
  kEncoderError,        // an encoder refused an image or failed; P/D never started
  kCount
};

enum class UpstreamSide { kPrefill, kDecode, kEncoder };

class ProxyMetrics {
 public:
  ProxyMetrics();
  // The encoder URLs, by index; call once before any count_encoder_*.
  void set_encoders(std::vector<std::string> urls);

  void count_request(ApiEndpoint endpoint, Outcome outcome);
  void add_in_flight(int delta) { num_in_flight_.fetch_add(delta); }
  int num_in_flight() const { return num_in_flight_.load(); }
  void count_upstream_error(UpstreamSide side);
  // Seconds from the client's request to the first byte of the answer sent to it.
  void observe_time_to_first_byte(double seconds);
  // Seconds from the client's request to the prefill server's (successful) answer.
  void observe_prefill(double seconds);
  // An image sent to encoder `index`; its failure (error status, unreachable, timeout, bad
  // answer); an image sent to the encoder it went to before.
  void count_encoder_request(int index);
  void count_encoder_failure(int index);
  void count_encoder_affinity();
  // Seconds from a request's first encoder call to its last encoder answer (all succeeded).
  void observe_encode(double seconds);

  // A prefill chosen by `router` ("round_robin", "kv_aware") for `reason` (kv_aware:
  // "prefix_hit", "no_prefix_hit", "no_hashes").
  void count_router_decision(const std::string& router, const std::string& reason);
  // kv_aware: of a prompt's `prompt_blocks` full blocks, the chosen prefill held `matched`.
  void count_router_blocks(int matched, int prompt_blocks);
  // kv_aware: the KV index's size (rendered as a gauge).
  void set_router_index_entries(int64_t n) { router_index_entries_.store(n); }

  // decodes: the decode (or --pd) servers' rotation states, labelled side=decode_side.
  std::string render(const std::vector<PrefillStatus>& prefills,
                     const std::vector<UpstreamState>& decodes = {},
                     const std::string& decode_side = "decode") const;

 private:
  mutable std::mutex mu_;
  std::array<std::array<uint64_t, static_cast<size_t>(Outcome::kCount)>,
             static_cast<size_t>(ApiEndpoint::kCount)>
      requests_{};                             // guarded by mu_
  std::array<uint64_t, 3> upstream_errors_{};  // guarded by mu_
  prometheus::Histogram time_to_first_byte_;   // guarded by mu_
  prometheus::Histogram prefill_;              // guarded by mu_
  prometheus::Histogram encode_;               // guarded by mu_
  std::vector<std::string> encoder_urls_;      // guarded by mu_
  std::vector<uint64_t> encoder_requests_;     // guarded by mu_; by encoder
  std::vector<uint64_t> encoder_failures_;     // guarded by mu_; by encoder
  uint64_t encoder_affinity_ = 0;              // guarded by mu_
  std::map<std::pair<std::string, std::string>, uint64_t> router_decisions_;  // guarded by mu_
  uint64_t router_matched_blocks_ = 0;                                        // guarded by mu_
  uint64_t router_prompt_blocks_ = 0;                                         // guarded by mu_
  std::atomic<int64_t> router_index_entries_{-1};                             // -1: no KV index
  std::atomic<int> num_in_flight_{0};
};

}  // namespace crescent::proxy
