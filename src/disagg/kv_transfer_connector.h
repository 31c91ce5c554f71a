#pragma once
// KvTransferConnector: engine::KvConnector over crescent's transfer engine — the only place
// where the engine meets the transfer engine (DESIGN.md §2, §4). One connector serves both
// directions of one engine rank:
//   - prefill side: a control listener (worker_addr()) where decode engines HELLO and ASK for a
//     transfer_id; when the engine holds that request's blocks, a connector thread WRITEs them
//     into the decode engine's registered KV memory, waits, and answers DONE;
//   - decode side: per request, resolve the prefill engine (injected resolver, cached), open
//     one control connection per prefill worker (cached), ASK, wait for DONE, report
//     kRemoteKvReady. Failures are reported only once no peer can write into the blocks.
// The control protocol, the state machines and their deadlines are in docs/disagg.md.
//
// Thread-safety: the engine::KvConnector methods follow that contract (engine thread, never
// blocking). worker_addr(), metrics(), render_metrics() and shutdown() may be called from any
// thread. Ownership: the KV memory (KvMemory::base) belongs to the caller and must outlive the
// connector (shutdown() unregisters it).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "disagg/compat_info.h"
#include "disagg/transfer_metrics.h"
#include "engine/kv_connector.h"
#include "transfer/transfer_engine.h"

namespace crescent::disagg {

// The engine's paged KV cache: block b occupies [base + b*block_bytes, +block_bytes). The
// memory must come from transfer::allocate_shared() (the shm transport needs that).
struct KvMemory {
  uint8_t* base = nullptr;
  uint64_t num_bytes = 0;
  uint64_t block_bytes = 0;
  int num_blocks = 0;
};

// engine_id -> "tcp://ip:port" of that prefill engine's control listener (the bootstrap
// client's EngineResolver::resolve in production, a fake in tests). NotFound: unknown engine;
// Unavailable: the bootstrap server could not be reached.
using EngineResolveFn = std::function<Result<std::string>(
    const std::string& bootstrap_url, const std::string& engine_id, Deadline deadline)>;
// Drops what the resolver cached for an engine whose worker turned out dead (refused or closed
// the connection), so that the next request for it asks the bootstrap again (EngineResolver::
// invalidate in production). Called with the connector's lock held: it must not call back.
using EngineForgetFn =
    std::function<void(const std::string& bootstrap_url, const std::string& engine_id)>;

struct DisaggOptions {
  std::string engine_id;  // this rank's id (registered with the bootstrap by the caller)
  transfer::TransportKind transport = transfer::TransportKind::kShm;
  std::string listen_host = "127.0.0.1";  // control listener (prefill side); exactly this host
  int listen_port = 0;                    // 0: any free port
  bool accept_asks = true;                // prefill side: listen for decode engines' asks
  // --auth-token-file: when not empty, the control and transfer connections run
  // net/auth/handshake.h's challenge-response before anything else; peers must hold the same.
  std::string auth_token;
  // --kv-transfer-timeout: the deadline of every state on both sides (placeholder, held
  // blocks, a whole fetch).
  std::chrono::milliseconds transfer_timeout{30'000};
  // A control connection sends a heartbeat after this much silence and is declared dead after
  // three intervals without any frame from the peer.
  std::chrono::milliseconds heartbeat_interval{1'000};
  // Decode side: how long to wait for CANCEL_ACK before closing the connection instead.
  std::chrono::milliseconds cancel_grace{1'000};
  int num_worker_threads = 4;  // connector threads that resolve/connect (D) and write (P)
  KvCompatInfo compat;
  KvMemory memory;
  EngineResolveFn resolve;  // decode side; required unless the engine is prefill-only
  EngineForgetFn forget;    // decode side; optional
  // Where to count (crescent_kv_transfer_*): share one among the ranks of a process so that
  // /metrics shows each family once. Null: the connector keeps its own.
  std::shared_ptr<TransferMetrics> metrics;
  // Fault injection for tests: runs on the write thread after a transfer's batch was
  // submitted and before it is waited for.
  std::function<void(const std::string& transfer_id)> on_write_submitted;
};

class KvTransferConnector final : public engine::KvConnector {
 public:
  // Creates the transfer engine, registers memory, starts the listener (accept_asks) and the
  // connector's threads. InvalidArgument names the bad option.
  static Result<std::unique_ptr<KvTransferConnector>> create(DisaggOptions options);
  ~KvTransferConnector() override;  // calls shutdown()
  KvTransferConnector(const KvTransferConnector&) = delete;
  KvTransferConnector& operator=(const KvTransferConnector&) = delete;

  // engine::KvConnector (see engine/kv_connector.h for the contract).
  void start_remote_prefill(const std::string& request_id, const engine::KvTransferParams& params,
                            std::span<const int32_t> prompt_token_ids,
                            std::span<const int32_t> block_ids, int num_local_tokens) override;
  bool hold_for_remote_decode(const std::string& request_id, const engine::KvTransferParams& params,
                              std::span<const int32_t> prompt_token_ids,
                              std::span<const int32_t> block_ids) override;
  void cancel(const std::string& request_id) override;
  void release_unpulled(const engine::KvTransferParams& params) override;
  std::vector<engine::KvConnectorEvent> take_events() override;
  int num_pending() const override;
  void set_wakeup(std::function<void()> fn) override;

  // Prefill side: the engine's request carrying params.transfer_id failed or was aborted before
  // hold_for_remote_decode(). The decode engine's ASK (waiting, or arriving later) is answered
  // with `why` at once instead of at the deadline. (engine::KvConnector's cancel(request_id)
  // cannot do this: before hold the connector does not know the request's transfer_id.)
  void fail_remote_decode(const std::string& request_id, const engine::KvTransferParams& params,
                          const Status& why) override;

  // "tcp://127.0.0.1:PORT" of the control listener (what the caller registers with the
  // bootstrap server); empty when accept_asks is false.
  std::string worker_addr() const;

  // The counters this connector counts into (shared with other ranks when options.metrics
  // was set).
  KvTransferMetricsSnapshot metrics() const;
  // Appends the crescent_kv_transfer_* families in Prometheus text format.
  void render_metrics(std::string* out) const;

  // Fails or cancels everything in flight (decode requests get kRemoteKvReady with an error,
  // held blocks kBlocksReleased), closes connections, joins threads, unregisters memory.
  // Idempotent.
  void shutdown();

  class Impl;  // kv_transfer_connector.cc

 private:
  explicit KvTransferConnector(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::disagg
