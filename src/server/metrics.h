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

  // crescent's metrics; with vllm_names, then the same quantities under vLLM's names and
  // labels (vllm:..., docs/server.md), for dashboards and routers written for vLLM. promtool's
  // lint flags a ':' in a name (it reserves them for recording rules), as it does on vLLM's own
  // /metrics: without vllm_names the text is promtool-clean.
  std::string render(const std::string& model_name, const EngineMetrics& engine, int num_in_flight,
                     bool vllm_names = false) const;

 private:
  void render_vllm_names_locked(const std::string& model_name, const EngineMetrics& engine,
                                std::string* out) const;

  mutable std::mutex mu_;
  Histogram ttft_;
  Histogram tpot_;
  Histogram itl_;
  Histogram e2e_;
  std::map<std::string, uint64_t> finished_by_reason_;
  std::map<int, uint64_t> http_by_status_;
};

}  // namespace crescent::server
