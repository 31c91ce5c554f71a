#pragma once
// The transfer engine: moves bytes between registered memory regions of processes, on this
// host (shm) or across hosts (tcp, ucx). The user model is Mooncake's Transfer Engine / NIXL:
//   1. register memory regions; local_segment() describes them for peers (serialisable);
//   2. open_segment(peer descriptor) -> PeerId (connects, authenticates when a token is set);
//   3. submit(peer, ops) -> BatchId, where an op is {READ|WRITE, local_addr, remote_region,
//      remote_offset, length}; poll()/wait() with a deadline; per-op and per-batch status;
//   4. notify(peer, bytes): small messages delivered to the peer's callback, in order per peer.
// It knows bytes, regions and peers, never requests or KV.
//
// Safety: the target checks every op against its live regions before any byte is moved
// (offset + length overflow included); a refused op fails with a clear status and writes
// nothing. A region being unregistered waits until no peer is moving bytes in it. A peer that
// dies or stalls fails its batches (at the latest when the batch deadline passes and the caller
// polls or waits); other peers are unaffected, and a fresh open_segment() can reconnect.
//
// Ownership: registered memory stays owned by the caller and must outlive its registration.
// Thread-safety: every public method may be called from any thread concurrently. The
// notification callback runs on an engine thread, one thread per connected peer, so calls for
// one peer are sequential and in send order; calls for different peers may run concurrently.
// Bytes that a peer's completed WRITEs put into this engine's regions are visible to the
// callback of a notification that the peer sends afterwards (the disaggregation pattern:
// WRITE the blocks, wait, then notify).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/ids.h"
#include "core/status.h"

namespace crescent::transfer {

enum class TransportKind : uint8_t { kShm = 1, kTcp = 2, kUcx = 3 };

std::string_view transport_name(TransportKind kind);
Result<TransportKind> parse_transport(std::string_view name);

// What a transport can do (NIXL-style capability predicates).
struct TransportCapabilities {
  bool supports_remote_host = false;  // peers on other hosts
  bool supports_read = true;          // READ ops
  bool supports_write = true;         // WRITE ops
  bool supports_notify = true;        // notify()
  bool is_one_sided = false;          // data moves without the target's CPU
  bool needs_shared_memory = false;   // regions must come from allocate_shared()
  bool uses_multiple_connections = false;
};
TransportCapabilities capabilities(TransportKind kind);
// Whether this build can create engines of `kind` (ucx is left out of TSan builds).
bool is_transport_available(TransportKind kind);
// The transports this build can create, in TransportKind order.
std::vector<TransportKind> available_transports();
// Their names, in the same order (for flags' help and for tests parametrised by name).
std::vector<std::string> available_transport_names();

using RegionId = StrongId<struct RegionTag>;
using PeerId = StrongId<struct PeerTag>;
using BatchId = StrongId<struct BatchTag>;

enum class OpKind : uint8_t { kRead = 1, kWrite = 2 };

// One transfer: WRITE copies [local_addr, +length) to remote_region at remote_offset; READ
// copies the other way.
struct TransferOp {
  OpKind kind = OpKind::kWrite;
  void* local_addr = nullptr;
  RegionId remote_region;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

struct RegionInfo {
  RegionId id;
  uint64_t length = 0;
};

// What a peer needs to open this engine's segment. Serialised as one line of JSON so that a
// control channel (the disaggregation layer's) can carry it.
struct SegmentDescriptor {
  std::string engine_name;
  TransportKind transport = TransportKind::kTcp;
  std::string address;              // "tcp:HOST:PORT" or "unix:@NAME"
  std::string transport_info_hex;   // ucx: the worker address; empty otherwise
  std::vector<RegionInfo> regions;  // the regions live when the descriptor was made

  std::string serialize() const;
  static Result<SegmentDescriptor> parse(std::string_view text);
};

using NotificationCallback = std::function<void(const std::string& peer_name, std::string message)>;

struct EngineOptions {
  TransportKind transport = TransportKind::kTcp;
  std::string name;                       // shown to peers; a uuid when empty
  std::string listen_host = "127.0.0.1";  // tcp/ucx control listener: bound to exactly this
  int listen_port = 0;                    // 0: any free port
  std::string token;  // non-empty: peers must prove it (net/auth/handshake.h); never sent
  int num_connections_per_peer = 2;              // tcp data connections per peer
  int num_copy_threads = 1;                      // shm: threads that copy one batch
  std::chrono::milliseconds io_timeout{10'000};  // a started frame must finish within this
  NotificationCallback on_notification;
  // UCX_TLS for this engine when the environment sets none; empty: UCX picks among all the
  // transports it finds (rc/dc/ud verbs across hosts, sm/cma/tcp on one host).
  std::string ucx_tls;
};

// A peer's region mapped read-only into this process (shm only; view_region()). The mapping
// stays valid while any copy of `keepalive` lives, even after the peer unregisters the region,
// closes or dies: reads never fault, but the bytes are whatever the peer's memory holds, and
// the peer may rewrite them at any moment. A caller must validate what it copies (e.g. with a
// stamp the peer clears before it reuses the memory).
struct RemoteRegionView {
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  std::shared_ptr<const void> keepalive;
};

// Status of a batch. op_status has one entry per submitted op, in submission order.
struct BatchStatus {
  bool is_done = false;
  Status status;  // OK, or the first failure when done
  std::vector<Status> op_status;
  uint64_t num_bytes = 0;  // bytes of the ops that succeeded
};

class TransferEngine {
 public:
  static Result<std::unique_ptr<TransferEngine>> create(EngineOptions options);
  virtual ~TransferEngine() = default;

  virtual TransportKind transport() const = 0;
  virtual const std::string& name() const = 0;

  // Registers [addr, +bytes). shm needs memory from allocate_shared() (capabilities()).
  virtual Result<RegionId> register_region(void* addr, uint64_t bytes) = 0;
  // Stops new ops on the region, waits until ops in progress finish, then forgets it.
  virtual Status unregister_region(RegionId id, Deadline deadline) = 0;
  virtual SegmentDescriptor local_segment() const = 0;

  virtual Result<PeerId> open_segment(const SegmentDescriptor& peer, Deadline deadline) = 0;
  // Fails the peer's unfinished batches (Cancelled) and disconnects.
  virtual Status close_segment(PeerId peer) = 0;

  // Queues a batch; ops may run in any order and adjacent ops are coalesced. The batch fails
  // with DeadlineExceeded if not done by `deadline`.
  virtual Result<BatchId> submit(PeerId peer, std::span<const TransferOp> ops,
                                 Deadline deadline) = 0;
  // Non-blocking. NotFound for an unknown or released batch.
  virtual Result<BatchStatus> poll(BatchId batch) = 0;
  // Blocks until the batch is done or `deadline`; returns the batch status, or
  // DeadlineExceeded if the wait (not the batch) timed out.
  virtual Status wait(BatchId batch, Deadline deadline) = 0;
  // Forgets a done batch (an unfinished one is released when it finishes).
  virtual void release(BatchId batch) = 0;

  // shm: maps the peer's region into this process (the first call per region leases it once
  // through the peer, like a 1-byte READ; later calls answer from the mapping), so that the
  // caller can copy out of it on its own thread without a round trip. NotFound when the peer
  // does not have the region; Unimplemented for tcp and ucx.
  virtual Result<RemoteRegionView> view_region(PeerId peer, RegionId region, Deadline deadline) = 0;

  // Sends a small message (<= kMaxNotificationBytes) to the peer's callback, ordered after
  // this peer's earlier notifications.
  virtual Status notify(PeerId peer, std::string_view message, Deadline deadline) = 0;
};

inline constexpr uint64_t kMaxNotificationBytes = 64 << 10;

}  // namespace crescent::transfer
