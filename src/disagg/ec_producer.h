#pragma once
// EcProducer: the encoder worker's side of the EC connector (EPD, DESIGN.md §2b). It owns a
// tensor pool of `pool_bytes` (transfer::allocate_shared(), registered with its own transfer
// engine), accounted by an EcTensorPool, and a control listener (worker_addr()) where prefill
// workers (EcConsumer) pull tensors; ec_protocol.h has the messages.
//
// publish(mm_hash, ...) finds the image's embeddings in the pool or allocates room and lets the
// caller encode straight into it, then reserves the entry for ONE consumer and returns the
// EcTensorRef that travels in ec_transfer_params, with the entry's location (region, offset,
// and this producer's random instance id) so that the consumer READs without EC_ACQUIRE. Identical
// images (same mm_hash) are encoded once: concurrent publishes wait for the one writer, and every
// publish gets its own reservation. Reservation lifecycle:
//   reserved (deadline = now + reservation_timeout; expires unpulled, the bytes return)
//   -> [pulling (old path only: a consumer's connection sent EC_ACQUIRE: pinned, no
//      deadline, while that connection lives)]
//   -> gone (EC_RELEASE, release(), expiry, or the pulling connection closed).
// The normal path never pins: the consumer READs the reserved entry, then EC_RELEASE says
// whether the reservation was still live (was_held), which proves the READ saw stable bytes.
// An entry with a reservation, or being written, is never evicted (EcTensorPool). A publish
// that cannot fit without evicting one is ResourceExhausted at once, or after waiting up to
// full_pool_wait for releases and expiries.
//
// Liveness: consumers send heartbeats; a connection silent for 3 of the consumer's heartbeat
// intervals is dropped (its pulls end). Expiry runs on a background thread every
// reservation_timeout / 10 (10 ms .. 1 s) and on expire_now().
//
// Thread-safety: every method may be called from any thread. `write` runs on the caller's
// thread without any producer lock held. Ownership: the producer owns its memory; the pointer
// passed to `write` is valid only during the call.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "disagg/ec_protocol.h"
#include "transfer/transfer_engine.h"

namespace crescent::disagg {

struct EcProducerOptions {
  std::string engine_id;  // required; printable ASCII, no spaces
  transfer::TransportKind transport = transfer::TransportKind::kShm;
  std::string listen_host = "127.0.0.1";  // EC control listener (and the tcp data listener)
  int listen_port = 0;                    // 0: any free port
  // --auth-token-file: when not empty, control and transfer connections authenticate with
  // net/auth/handshake.h first; the peers must hold the same token.
  std::string auth_token;
  uint64_t pool_bytes = 256ull << 20;                     // --ec-pool-size
  std::chrono::milliseconds reservation_timeout{30'000};  // an unpulled reservation expires
  // 0: a full pool is ResourceExhausted at once; > 0: wait up to this for space.
  std::chrono::milliseconds full_pool_wait{0};
  EcCompat compat;
  std::string bootstrap_addr;  // copied into refs
  // The producer's side of liveness before a consumer's EC_HELLO tells its own interval.
  std::chrono::milliseconds heartbeat_interval{1'000};
  // Fault injection for tests: runs on the connection's reader thread right after an
  // EC_ACQUIRED was queued, without any producer lock held.
  std::function<void(uint64_t reservation_id)> on_acquired;
};

struct EcProducerMetrics {
  uint64_t pool_bytes = 0;      // usable bytes of the pool
  uint64_t bytes_used = 0;      // held by entries in any state
  uint64_t bytes_reserved = 0;  // held by entries with reservations
  int num_entries = 0;
  int num_reserved_entries = 0;
  int num_reservations = 0;  // live (reserved or pulling)
  int num_pulling = 0;       // pinned by a consumer connection
  int num_connections = 0;   // consumer control connections open
  uint64_t num_publishes = 0;
  uint64_t num_cache_hits = 0;  // publishes that skipped `write`
  uint64_t num_evictions = 0;
  uint64_t num_expired_reservations = 0;
  // Tensors pulled: EC_ACQUIREs answered with EC_ACQUIRED, plus located EC_RELEASEs that
  // confirmed a READ (was_held).
  uint64_t num_pulls_served = 0;
  uint64_t num_acquires_served = 0;  // of those, by EC_ACQUIRE (refs without a location)
  uint64_t num_bytes_served = 0;
  uint64_t num_releases = 0;  // reservations ended by EC_RELEASE, release() or a closed pull
  uint64_t num_refusals = 0;  // publishes refused for space (ResourceExhausted)
  uint64_t num_write_failures = 0;
};

class EcProducer {
 public:
  // Allocates and registers the pool, starts the transfer engine, the listener and the expiry
  // thread. InvalidArgument names the bad option.
  static Result<std::unique_ptr<EcProducer>> create(EcProducerOptions options);
  ~EcProducer();  // stops the listener, closes connections, unregisters memory
  EcProducer(const EcProducer&) = delete;
  EcProducer& operator=(const EcProducer&) = delete;

  // "tcp://HOST:PORT" of the EC control listener (what refs carry).
  const std::string& worker_addr() const;
  const std::string& engine_id() const;

  // Finds mm_hash in the pool or allocates num_tokens * hidden_size floats for it and calls
  // write(dst) once (the caller encodes straight into the pool); concurrent publishes of one
  // mm_hash encode once (the others wait for it, within deadline, and share its failure).
  // Then reserves the entry for one consumer and returns its ref. *was_cached (optional) says
  // whether write was skipped. InvalidArgument: bad sizes, hidden_size differs from
  // compat.hidden_size (when set), or more than the whole pool. ResourceExhausted (pool size,
  // bytes reserved, being written, free): the pool cannot hold it without evicting a reserved
  // or unwritten entry (after full_pool_wait). DeadlineExceeded: waiting for another writer
  // or for space ran past deadline. A failed write is returned with context.
  Result<EcTensorRef> publish(const std::string& mm_hash, int64_t num_tokens, int64_t hidden_size,
                              const std::function<Status(float* dst)>& write, Deadline deadline,
                              bool* was_cached = nullptr);
  // Written and present (any reservation state).
  bool holds(const std::string& mm_hash) const;
  // Ends a reservation (reserved or pulling). NotFound for an unknown, released or expired id.
  Status release(uint64_t reservation_id);
  // Runs expiry now (the background thread also runs it periodically).
  void expire_now();

  EcProducerMetrics metrics() const;
  // The crescent_ec_producer_* families in Prometheus text, labelled model_name.
  std::string render_metrics(const std::string& model_name) const;

  class Impl;  // ec_producer.cc

 private:
  explicit EcProducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::disagg
