#pragma once
// Server metrics in the Prometheus text exposition format (version 0.0.4): latency histograms
// the server observes (time to first token, time per output token, end-to-end) and request
// counters, plus the engine's gauges and counters rendered from an EngineMetrics snapshot.
// Thread-safe.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/prometheus.h"
#include "server/engine_client.h"

namespace crescent::server {

using prometheus::Histogram;

class ServerMetrics {
 public:
  ServerMetrics();

  void observe_finished(const std::string& finish_reason, double ttft_s, double e2e_s,
                        int num_output_tokens);
  // The gap between two consecutive outputs of one request that carry tokens, as the server
  // hands them to the client (vLLM's inter_token_latency; here with millisecond buckets too,
  // so that a decode server's own stalls can be told from the network's).
  void observe_inter_token(double gap_s);
  void observe_http_request(int status);

  std::string render(const std::string& model_name, const EngineMetrics& engine,
                     int num_in_flight) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_;
  Histogram tpot_;
  Histogram itl_;
  Histogram e2e_;
  std::map<std::string, uint64_t> finished_by_reason_;
  std::map<int, uint64_t> http_by_status_;
};

}  // namespace crescent::server
