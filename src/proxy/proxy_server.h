#pragma once
// `crescent proxy` as an object: the OpenAI-compatible HTTP front that clients talk to, over
// pools of prefill and decode servers (DESIGN.md §2).
//
//   POST /v1/completions, /v1/chat/completions  -> a CompletionRelay (completion_relay.h)
//   GET  /v1/models                             -> forwarded to a decode server
//   GET  /health                                -> 200 once every prefill is ready, else 503
//   GET  /metrics                               -> Prometheus text (proxy_metrics.h)
//
// Upstream calls are asynchronous (upstream_client.h): the HTTP server's I/O threads never
// block, and a request in flight costs two sockets and a few KiB, not a thread.
// Thread-safe; destroying it stops everything.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "core/status.h"
#include "net/http/http_server.h"
#include "proxy/prefill_registry.h"
#include "proxy/proxy_metrics.h"
#include "proxy/proxy_options.h"
#include "proxy/upstream_client.h"

namespace crescent::proxy {

class ProxyServer {
 public:
  // Listens and starts the readiness pollers. Unavailable if the address is in use.
  static Result<std::unique_ptr<ProxyServer>> start(ProxyOptions options);
  ~ProxyServer();  // stop()

  int port() const;
  bool is_ready() const { return registry_.is_ready(); }
  // Completion requests whose answer is not complete yet.
  int num_in_flight() const { return metrics_.num_in_flight(); }
  UpstreamClient::Stats upstream_stats() const { return upstream_->stats(); }

  // New connections are refused; requests in flight go on.
  void stop_accepting();
  // Closes every client and upstream connection and stops the pollers. Idempotent.
  void stop();

 private:
  explicit ProxyServer(ProxyOptions options);
  void handle(net::http::Request request, std::shared_ptr<net::http::ResponseWriter> writer);
  void handle_completion(ApiEndpoint endpoint, net::http::Request request,
                         const std::shared_ptr<net::http::ResponseWriter>& writer);
  void handle_models(const net::http::Request& request,
                     const std::shared_ptr<net::http::ResponseWriter>& writer);
  const UpstreamUrl& next_decode();

  const ProxyOptions options_;
  ProxyMetrics metrics_;
  PrefillRegistry registry_;
  // Request ids of relays in flight: two requests with one transfer id would swap KV.
  std::mutex ids_mu_;
  std::unordered_set<std::string> ids_in_flight_;  // guarded by ids_mu_
  std::atomic<uint64_t> next_decode_{0};
  // Destroyed before the members above, which relays use until their calls end.
  std::unique_ptr<UpstreamClient> upstream_;
  std::unique_ptr<net::http::Server> http_;
  std::atomic<bool> stopped_{false};
};

}  // namespace crescent::proxy
