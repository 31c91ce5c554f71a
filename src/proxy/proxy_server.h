#pragma once
// `crescent proxy` as an object: the OpenAI-compatible HTTP front that clients talk to, over
// pools of prefill and decode servers (DESIGN.md §2), or of colocated prefill+decode servers
// (--pd), with encoder servers in front for requests with images (EPD, DESIGN.md §2b).
//
//   POST /v1/completions, /v1/chat/completions  -> with images and encoders: the encoder stage
//                                                  (encoder_stage.h), then a CompletionRelay
//                                                  (completion_relay.h); else the relay alone
//   GET  /v1/models                             -> forwarded to a decode server
//   GET  /health                                -> 200 once every prefill is ready, else 503
//   GET  /metrics                               -> Prometheus text (proxy_metrics.h)
// With --api-key every path but /health and /metrics needs the client's key (else 401).
//
// Decode (or --pd) servers rotate round-robin over the ones that are up (upstream_health.h): a
// server a call could not reach is skipped until a /health probe, on the proxy's own thread
// with exponential backoff, finds it answering again; with none up, completions get 503 at once
// and no prefill server is asked.
//
// Upstream calls are asynchronous (upstream_client.h): the HTTP server's I/O threads never
// block, and a request in flight costs two sockets and a few KiB, not a thread.
// Thread-safe; destroying it stops everything.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>

#include "core/status.h"
#include "core/task_queue.h"
#include "net/http/api_key.h"
#include "net/http/http_server.h"
#include "proxy/discovery.h"
#include "proxy/encoder_stage.h"
#include "proxy/kv_router.h"
#include "proxy/prefill_registry.h"
#include "proxy/proxy_metrics.h"
#include "proxy/proxy_options.h"
#include "proxy/upstream_client.h"
#include "proxy/upstream_health.h"

namespace crescent::proxy {

class ProxyServer {
 public:
  // Listens and starts the readiness pollers. Unavailable if the address is in use.
  static Result<std::unique_ptr<ProxyServer>> start(ProxyOptions options);
  ~ProxyServer();  // stop()

  int port() const;
  bool is_ready() const { return is_pd_mode() || registry_.is_ready(); }
  // Completion requests whose answer is not complete yet.
  int num_in_flight() const { return metrics_.num_in_flight(); }
  UpstreamClient::Stats upstream_stats() const { return upstream_->stats(); }

  // New connections are refused; requests in flight go on.
  void stop_accepting();
  // Closes every client and upstream connection and stops the pollers. Idempotent.
  void stop();

 private:
  // What one completion carries from its arrival to the relay.
  struct Completion {
    ApiEndpoint endpoint = ApiEndpoint::kCompletions;
    std::string request_id;
    int64_t arrival_ns = 0;
    Deadline deadline = Deadline::never();
    std::string target;  // "/v1/completions" or "/v1/chat/completions"
    std::string authorization;
    std::string raw_body;  // as the client sent it
    Json body;
    std::optional<PrefillPick> pick;  // none in --pd mode
  };

  explicit ProxyServer(ProxyOptions options);
  bool is_pd_mode() const { return !options_.pds.empty(); }
  void handle(net::http::Request request, std::shared_ptr<net::http::ResponseWriter> writer);
  void handle_completion(ApiEndpoint endpoint, net::http::Request request,
                         const std::shared_ptr<net::http::ResponseWriter>& writer);
  // GET /v1/models, POST /tokenize and /detokenize: relayed whole to one decode server.
  void relay_whole(ApiEndpoint endpoint, const net::http::Request& request,
                   const std::shared_ptr<net::http::ResponseWriter>& writer);
  // Starts the relay; `ec_items` (the merged encoder items) go to the server that prefills.
  void dispatch(const Completion& completion, const Json* ec_items,
                const std::shared_ptr<net::http::ResponseWriter>& writer);
  void release_request_id(const std::string& id);
  // The Authorization header for upstream calls made for `request` ("" for none).
  std::string upstream_authorization(const net::http::Request& request) const;
  // The decode (or --pd) server at an index decode_health_ gave.
  UpstreamUrl decode_url(size_t index) const;
  // --discover: members that joined or left (on the watcher's thread).
  void apply_membership(const MembershipChange& change);
  // The next decode server (or --pd server) in rotation; nullopt when none is up. With the
  // kv_aware router, the one up with the fewest requests in flight (ties in rotation).
  std::optional<size_t> next_decode();
  // The prefill (and dp rank) for a request: round-robin, or with the kv_aware router the best
  // score (kv_router.h), which may ask a prefill's /tokenize (blocking: never on an I/O
  // thread). nullopt while not every prefill is ready.
  std::optional<PrefillPick> pick_prefill(const Json& body, const std::string& authorization);
  // The 503 for "no decode server is up", naming each and why. Counts the request.
  void answer_no_decode(ApiEndpoint endpoint, const std::string& request_id,
                        net::http::ResponseWriter& writer);
  // Probes the decode servers out of rotation (upstream_health.h) until stop().
  void probe_loop();

  // Bodies at least this large are handled on body_workers_.
  static constexpr size_t kLargeBodyBytes = 256 << 10;

  const ProxyOptions options_;
  net::http::ApiKeyCheck api_key_;  // from options_.api_key; set before listening
  ProxyMetrics metrics_;
  PrefillRegistry registry_;
  // Request ids of relays in flight: two requests with one transfer id would swap KV.
  std::mutex ids_mu_;
  std::unordered_set<std::string> ids_in_flight_;  // guarded by ids_mu_
  UpstreamHealth decode_health_;
  // Decode (or --pd) servers by decode_health_ index: the static ones, then those discovered,
  // appended (never removed, so an index stays valid while a request uses it).
  mutable std::mutex decode_urls_mu_;
  std::vector<UpstreamUrl> decode_urls_;    // guarded by decode_urls_mu_
  std::unique_ptr<MemberWatcher> watcher_;  // --discover; null otherwise
  std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  bool is_probe_stopping_ = false;  // guarded by probe_mu_
  std::thread probe_thread_;
  EncoderRouter encoder_router_;
  // Destroyed before the members above, which relays use until their calls end.
  std::unique_ptr<UpstreamClient> upstream_;
  std::unique_ptr<net::http::Server> http_;
  // Parsing and rewriting a large body (an image-carrying chat request: a 720p PNG is 3.7 MB
  // of base64, a 20 ms parse and 10 ms per rewritten body) runs here, off the I/O threads that
  // relay every stream's tokens, so one arrival does not stall the streams in flight. Declared
  // last: destroyed first, after stop(), running what was posted (new calls then end at once).
  std::unique_ptr<TaskQueue> body_workers_;
  // --router kv_aware (null otherwise): the KV index and its feeds; requests in flight per
  // prefill (until its prefill call ended) and per decode server; completions are handled on
  // route_workers_, since picking a prefill may call one.
  std::unique_ptr<KvRouter> kv_router_;
  std::unique_ptr<std::atomic<int>[]> prefill_load_;
  std::unique_ptr<std::atomic<int>[]> decode_load_;
  std::atomic<uint64_t> route_counter_{0};
  std::unique_ptr<TaskQueue> route_workers_;  // destroyed first, running what was posted
  std::atomic<bool> stopped_{false};
};

}  // namespace crescent::proxy
