#pragma once
// Blocking client of the bootstrap server (bootstrap_server.h), for worker threads: register a
// worker's transfer address (or an encoder's EC listener, role "encode"), query the whole
// table, and resolve an engine id to the address of its tp 0 / pp 0 worker (or of an encoder)
// with a cache shared by all threads (EngineResolver).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::bootstrap {

inline constexpr std::string_view kEncodeRole = "encode";

struct WorkerRegistration {
  std::string engine_id;
  int dp_rank = 0;
  int tp_rank = 0;
  int pp_rank = 0;
  std::string addr;  // "tcp://host:port"
  // "": a dp rank's worker (vLLM's registration, no "role" on the wire). "encode": an EPD
  // encoder's EC control listener, kept apart from the dp ranks (its ranks are ignored).
  std::string role = {};
  // Seconds the registration holds unless renewed (re-registered); 0: it never expires
  // (vLLM's workers send none). The bootstrap may grant less (see Registered).
  double lease_ttl_s = 0;
  // --auth-token-file: when not empty, POST /register is signed with it (request_signing.h);
  // the token itself is never sent.
  std::string auth_token = {};
};

// What the bootstrap answered to a registration.
struct Registered {
  uint64_t epoch = 0;       // the dp rank's epoch (1 for the first owner, +1 per replacement)
  double lease_ttl_s = 0;   // the lease granted (0: none, the entry never expires)
  bool is_renewal = false;  // identical to the entry it renewed (not sent on the wire)
};

struct DpEntry {
  std::string engine_id;
  uint64_t epoch = 0;  // 0 when the bootstrap did not say (vLLM's)
  std::map<int, std::map<int, std::string>> worker_addr;  // tp -> pp -> "tcp://host:port"
};
using QueryResult = std::map<int, DpEntry>;               // dp rank -> entry
using EncoderTable = std::map<std::string, std::string>;  // engine id -> "tcp://host:port"

// "tcp://host:port" -> {host, port}. InvalidArgument (naming the input) otherwise.
Result<std::pair<std::string, int>> parse_tcp_addr(std::string_view addr);
// "http://host:port" or "http://host:port/" -> {host, port}. InvalidArgument otherwise.
Result<std::pair<std::string, int>> parse_http_url(std::string_view url);

// One attempt each. `url` is "http://host:port" (InvalidArgument otherwise).
// register_worker: OK on 200; AlreadyExists with the server's reason when the registration
// conflicts with an earlier one (400); InvalidArgument when a field is bad (400);
// Unavailable when the server cannot be reached or answers 5xx; DeadlineExceeded past the
// deadline; FailedPrecondition when the url is not a bootstrap server (404/405). An engine
// that was fenced (replaced by another, 409) is AlreadyExists too.
Status register_worker(const std::string& url, const WorkerRegistration& registration,
                       Deadline deadline);
// The same registration sent again to renew its lease (LeaseKeeper): OK with what was granted,
// or is_fenced with the server's reason when this engine was replaced; failures as above.
struct Renewal {
  Registered granted;
  bool is_fenced = false;
  std::string fenced_reason;
};
Result<Renewal> renew_registration(const std::string& url, const WorkerRegistration& registration,
                                   Deadline deadline);
// The whole table. Unavailable on 503 (not every dp rank registered yet; the message lists
// the missing ones) or when unreachable; DataLoss when the answer is not the documented shape.
Result<QueryResult> query(const std::string& url, Deadline deadline);
// GET /query?role=encode: every registered encoder (possibly none; never 503).
Result<EncoderTable> query_encoders(const std::string& url, Deadline deadline);

// Retries register_worker with exponential backoff (100 ms doubling to 2 s; each attempt at
// most 5 s) while it fails with Unavailable or DeadlineExceeded, until OK, any other failure
// (a 400 conflict or bad field: returned at once) or the deadline (DeadlineExceeded naming
// the number of attempts and the last failure).
Status register_with_retry(const std::string& url, const WorkerRegistration& registration,
                           Deadline deadline);

// Resolves engine_id -> "tcp://ip:port" of its tp 0, pp 0 worker through a bootstrap url,
// caching answers. Concurrent resolve() calls for the same (url, engine_id) collapse into one
// query; the others wait for its result (up to their own deadlines). Failures are not cached.
// Thread-safe.
class EngineResolver {
 public:
  EngineResolver();
  ~EngineResolver();
  EngineResolver(const EngineResolver&) = delete;
  EngineResolver& operator=(const EngineResolver&) = delete;

  // NotFound (naming the engine id and url) when the bootstrap answers without it;
  // Unavailable when it is unreachable or not ready; DeadlineExceeded past the deadline.
  Result<std::string> resolve(const std::string& url, const std::string& engine_id,
                              Deadline deadline);
  // The same for an encoder (registered with role "encode"), through GET /query?role=encode;
  // cached apart from the dp ranks' answers.
  Result<std::string> resolve_encoder(const std::string& url, const std::string& engine_id,
                                      Deadline deadline);
  // Drops a cached answer (e.g. after the peer turned out dead); the next resolve() queries.
  void invalidate(const std::string& url, const std::string& engine_id);
  void invalidate_encoder(const std::string& url, const std::string& engine_id);
  // Queries actually sent (for tests).
  int64_t num_queries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::bootstrap
