#pragma once
// The bootstrap server: a small HTTP service where every prefill worker registers the address
// of its transfer endpoint, and where decode workers (and the proxy) look those addresses up.
// Wire shapes are vLLM Mooncake's (DESIGN.md §3, docs/bootstrap.md):
//   POST /register {"engine_id","dp_rank","tp_rank","pp_rank","addr"[,"lease_ttl_s"]}
//                   -> 200 {"status":"ok","epoch":N[,"lease_ttl_s":T]}; 400 on a conflict with a
//                   live owner; 409 (registration_fenced) for an engine that was replaced
//   GET  /query  -> 200 {"<dp>": {"engine_id", "worker_addr": {"<tp>": {"<pp>": addr}}}},
//                   503 until every expected dp rank has registered
// and crescent's EPD extension, which vLLM's clients never see:
//   POST /register {"engine_id", "addr", "role": "encode"} (ranks optional and ignored): an
//                   encoder's EC control listener, kept apart from the dp ranks (it neither
//                   takes one nor counts toward expected_dp_ranks; an engine id is one or the
//                   other); any other "role" is 400
//   GET  /query?role=encode -> 200 {"<engine_id>": {"role": "encode", "worker_addr": addr}}
//                   with whatever encoders registered (never 503); another role is 400
//   GET  /health -> 200 while the process serves HTTP (not a readiness signal: use /query)
// Leases, epochs and replacement of owners that are gone: worker_registry.h. Registrations
// live in memory only. Thread-safe; stop() (or destruction) closes everything.

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace crescent::bootstrap {

struct BootstrapServerOptions {
  std::string host = "127.0.0.1";
  int port = 8998;  // 0: any free port (see BootstrapServer::port())
  // dp ranks 0..expected_dp_ranks-1 must all register before /query answers 200.
  int expected_dp_ranks = 1;
  int threads = 1;  // HTTP I/O threads
  // Longest lease a registration is granted (it may ask for less); see worker_registry.h.
  double max_lease_ttl_s = 10;
  // How long a probe of a conflicting owner's address may take (on the I/O thread).
  std::chrono::milliseconds probe_timeout{500};
  // --auth-token-file: when not empty, POST /register (and so every renewal) must be signed
  // with it (request_signing.h) or is refused 401. GET /query and /health stay open.
  std::string auth_token;
};

class BootstrapServer {
 public:
  // Binds and starts serving. InvalidArgument for bad options, Unavailable if the port is taken.
  static Result<std::unique_ptr<BootstrapServer>> start(BootstrapServerOptions options);
  ~BootstrapServer();
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  int port() const;
  std::string url() const;  // "http://HOST:PORT"
  // Closes the listener and every connection. Idempotent.
  void stop();

 private:
  struct Impl;
  explicit BootstrapServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::bootstrap
