#pragma once
// EcConsumer: the prefill worker's side of the EC connector (EPD, DESIGN.md §2b). fetch()
// pulls the tensors that ec_transfer_params name from their encoders' pools into the caller's
// buffers through this consumer's own transfer engine, and releases every reservation.
//
// Per encoder (refs are grouped by worker_addr, groups run concurrently): take an idle control
// connection to it or open one (EC_HELLO -> EC_HELLO_OK with the encoder's transfer segment;
// EC_REFUSED on a compat mismatch), open the encoder's segment (cached per encoder, reopened
// when its descriptor changes or a READ fails), READ every ref in one batch at the pool
// location the ref carries, then EC_RELEASE every ref at once (with that location) and wait
// for the EC_RELEASED answers. A ref's bytes count only if its EC_RELEASED says was_held: the
// reservation was still live after the READ, so its entry was never evicted or rewritten
// during it (ec_protocol.h has the argument); was_held false fails the fetch with NotFound. A
// ref without a location (an older encoder) is EC_ACQUIREd first (pinned for this connection,
// answered with its location) and then read and released the same way.
// A clean connection goes back to the idle set (at most max_idle_connections per encoder,
// kept alive by heartbeats); one that failed is closed gracefully after queuing EC_RELEASE for
// every ref not yet released, and the encoder releases whatever that connection pinned when
// it sees it close. A READ that did not finish cleanly closes the encoder's transfer segment
// (which stops the copy) before fetch() returns, so no byte lands in dst afterwards.
//
// shm fast path: once this consumer has opened an encoder's segment (after a compatible
// EC_HELLO from the ref's engine id), a later ref of that encoder that carries a stamp and has
// not expired is copied on the calling thread straight out of the encoder's pool, mapped into
// this process (TransferEngine::view_region), with no round trip: the stamp before the tensor
// is loaded before and after the copy, and the copy counts only if both equal the ref's stamp
// (the encoder clears it before the memory can be reused; ec_tensor_pool.h). Its EC_RELEASE
// is then sent asynchronously. Not while the encoder is lost: after a control connection to it
// ended without this side closing it (it died, or missed 3 heartbeats) and until a pull over
// the control connection succeeds again, its refs take the path above, which fails or falls
// back as for any dead encoder. Any other case (first contact, no stamp, stale stamp, tcp/ucx)
// takes the path above too.
//
// Where an encoder is: a ref with a bootstrap_addr has its engine_id resolved through that
// bootstrap server (options.resolve: GET /query?role=encode, cached per engine id by the
// resolver), and the answer replaces its worker_addr; a ref without one, or a failed
// resolution (logged), uses its worker_addr as is. Either way EC_HELLO_OK must name the ref's
// engine_id, or the fetch fails. Refs of the disk connector (file://) are refused.
//
// Thread-safety: every method may be called from any thread, concurrently.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "disagg/ec_protocol.h"
#include "transfer/transfer_engine.h"

namespace crescent::disagg {

struct EcConsumerOptions {
  transfer::TransportKind transport = transfer::TransportKind::kShm;
  std::chrono::milliseconds timeout{30'000};  // a whole fetch (capped by fetch()'s deadline)
  EcCompat compat;
  std::string name = "prefill";  // shown in the encoder's logs
  // Heartbeats on control connections; an encoder silent for 3 intervals is declared dead.
  std::chrono::milliseconds heartbeat_interval{1'000};
  int max_idle_connections = 4;           // per encoder
  std::string listen_host = "127.0.0.1";  // this consumer's transfer engine listener
  // --auth-token-file: when not empty, control and transfer connections authenticate with
  // net/auth/handshake.h first; the peers must hold the same token.
  std::string auth_token;
  // bootstrap url, engine id -> the encoder's "tcp://HOST:PORT" (EngineResolver's
  // resolve_encoder); empty: refs' worker_addr is always used.
  std::function<Result<std::string>(const std::string& bootstrap_url, const std::string& engine_id,
                                    Deadline deadline)>
      resolve;
};

struct EcConsumerMetrics {
  uint64_t num_fetches = 0;  // fetch() calls
  uint64_t num_failures = 0;
  uint64_t num_tensors = 0;  // tensors fetched by successful calls
  uint64_t num_bytes = 0;
  double fetch_seconds_total = 0;  // over every call, successful or not
  uint64_t num_connections_opened = 0;
  uint64_t num_resolve_failures = 0;     // bootstrap lookups that failed (worker_addr was used)
  uint64_t num_mapped_copies = 0;        // tensors served by the shm fast path
  uint64_t num_stale_mapped_copies = 0;  // fast-path copies refused by their stamp
};

class EcConsumer {
 public:
  static Result<std::unique_ptr<EcConsumer>> create(EcConsumerOptions options);
  ~EcConsumer();  // closes connections (the encoders release what they pinned)
  EcConsumer(const EcConsumer&) = delete;
  EcConsumer& operator=(const EcConsumer&) = delete;

  // Pulls each refs[i]'s tensor into dsts[i] (dsts[i].size() * 4 == refs[i].num_bytes) and
  // releases its reservation on the encoder. Within min(deadline, now + options.timeout), or
  // DeadlineExceeded / Unavailable with a message naming the encoder; a compat mismatch is
  // FailedPrecondition naming both sides; an expired or unknown reservation is NotFound; bad
  // arguments are InvalidArgument. Refs of different encoders are fetched concurrently; every
  // reservation is released on every path (success, failure, deadline).
  Status fetch(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
               Deadline deadline);
  // Tells the encoders the reservations are not needed (the request was aborted before
  // fetching). Best effort and asynchronous: returns at once, a background thread sends.
  void release(std::span<const EcTensorRef> refs);

  EcConsumerMetrics metrics() const;
  // The crescent_ec_consumer_* families in Prometheus text, labelled model_name.
  std::string render_metrics(const std::string& model_name) const;

  class Impl;  // ec_consumer.cc

 private:
  explicit EcConsumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::disagg
