// The engine core: registration, segments, batches (coalescing ops into pieces and finishing
// them), and dispatch to the transport's link (tcp/, shm/ + ucx/ behind one_sided_link) and
// the target-side server. The transports live in their own files; see transfer_engine.h.
#include "transfer/transfer_engine.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/logging.h"
#include "net/auth/auth_token.h"
#include "net/socket.h"
#include "transfer/link.h"
#include "transfer/one_sided_link.h"
#include "transfer/protocol.h"
#include "transfer/region_table.h"
#include "transfer/server.h"
#include "transfer/shared_memory.h"
#include "transfer/shm/shm_mover.h"
#include "transfer/tcp/tcp_link.h"
#include "transfer/ucx/ucx_context.h"
#include "transfer/ucx/ucx_mover.h"
#include "transfer/wire.h"

namespace crescent::transfer {

namespace {

using net::Fd;

// ---------------------------------------------------------------------------------------------
// The engine.

class Engine final : public TransferEngine, private PieceSink {
 public:
  explicit Engine(EngineOptions options) : options_(std::move(options)) {
    if (options_.name.empty())
      options_.name = "engine-" + random_uuid();
  }

  ~Engine() override {
    std::map<int64_t, std::shared_ptr<Link>> links;
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      links.swap(links_);
    }
    for (auto& [id, link] : links) {
      link->shutdown();
    }
    links.clear();
    if (server_)
      server_->stop();
    for (Region& r : regions_.take_all()) {
      if (r.ucx_memh != nullptr)
        ucx_->unmap(r.ucx_memh);
      if (r.memfd >= 0)
        ::close(r.memfd);
    }
  }

  Status start() {
    if (options_.num_connections_per_peer < 1 || options_.num_connections_per_peer > 16) {
      return invalid_argument("num_connections_per_peer must be 1..16");
    }
    if (options_.name.size() > wire::kMaxNameBytes)
      return invalid_argument("name too long");
    if (options_.transport == TransportKind::kUcx) {
      // Empty: UCX's own choice among every transport it finds (RDMA across hosts when
      // there is a NIC for it), not a pinned list.
      ASSIGN_OR_RETURN(ucx_, UcxContext::create(options_.ucx_tls));
    }
    Fd listener;
    if (options_.transport == TransportKind::kShm) {
      std::string socket_name = "crescent-transfer-" + random_uuid();
      ASSIGN_OR_RETURN(listener, net::listen_unix_abstract(socket_name));
      address_ = "unix:@" + socket_name;
    } else {
      ASSIGN_OR_RETURN(listener, net::listen_tcp(options_.listen_host, options_.listen_port));
      ASSIGN_OR_RETURN(int port, net::local_port(listener));
      address_ = "tcp:" + options_.listen_host + ":" + std::to_string(port);
    }
    server_ = std::make_unique<TransferServer>(options_.transport, options_.token, &regions_,
                                               options_.on_notification, options_.io_timeout,
                                               options_.name);
    server_->start(std::move(listener));
    return Status::ok();
  }

  TransportKind transport() const override { return options_.transport; }
  const std::string& name() const override { return options_.name; }

  Result<RegionId> register_region(void* addr, uint64_t bytes) override {
    if (addr == nullptr || bytes == 0)
      return invalid_argument("register_region: empty range");
    if (reinterpret_cast<uintptr_t>(addr) + bytes < reinterpret_cast<uintptr_t>(addr)) {
      return invalid_argument("register_region: range wraps around");
    }
    Region r;
    r.addr = static_cast<uint8_t*>(addr);
    r.length = bytes;
    if (options_.transport == TransportKind::kShm) {
      auto shared = find_shared(addr, bytes);
      if (!shared.is_ok()) {
        return failed_precondition(
            "the shm transport registers only memory from allocate_shared(): " +
            shared.status().message());
      }
      r.memfd = shared->memfd;
      r.file_offset = shared->file_offset;
    } else if (options_.transport == TransportKind::kUcx) {
      ASSIGN_OR_RETURN(UcxMapping m, ucx_->map(addr, bytes));
      r.ucx_memh = m.memh;
      r.rkey = std::move(m.packed_rkey);
    }
    return regions_.add(std::move(r));
  }

  Status unregister_region(RegionId id, Deadline deadline) override {
    ASSIGN_OR_RETURN(Region r, regions_.remove(id, deadline));
    if (r.ucx_memh != nullptr)
      ucx_->unmap(r.ucx_memh);
    if (r.memfd >= 0)
      ::close(r.memfd);
    return Status::ok();
  }

  SegmentDescriptor local_segment() const override {
    SegmentDescriptor d;
    d.engine_name = options_.name;
    d.transport = options_.transport;
    d.address = address_;
    if (ucx_)
      d.transport_info_hex = net::auth::to_hex(ucx_->worker_address());
    d.regions = regions_.list();
    return d;
  }

  Result<PeerId> open_segment(const SegmentDescriptor& peer, Deadline deadline) override {
    if (peer.transport != options_.transport) {
      return failed_precondition("peer segment uses transport " +
                                 std::string(transport_name(peer.transport)) + ", this engine " +
                                 std::string(transport_name(options_.transport)));
    }
    LinkConfig cfg{options_.name, options_.token, options_.transport, options_.io_timeout};
    std::shared_ptr<Link> link;
    if (options_.transport == TransportKind::kTcp) {
      std::vector<Fd> fds;
      for (int i = 0; i < options_.num_connections_per_peer; ++i) {
        ASSIGN_OR_RETURN(Fd fd, connect_and_hello(cfg, peer, static_cast<uint32_t>(i), deadline));
        fds.push_back(std::move(fd));
      }
      link = make_tcp_link(static_cast<PieceSink*>(this), std::move(fds), options_.io_timeout);
    } else {
      ASSIGN_OR_RETURN(Fd fd, connect_and_hello(cfg, peer, 0, deadline));
      std::unique_ptr<Mover> mover;
      if (options_.transport == TransportKind::kShm) {
        mover = make_shm_mover(options_.num_copy_threads);
      } else {
        ASSIGN_OR_RETURN(std::string worker, from_hex(peer.transport_info_hex));
        ASSIGN_OR_RETURN(auto ep, ucx_->connect(worker));
        mover = make_ucx_mover(std::move(ep), &regions_);
      }
      link = make_one_sided_link(static_cast<PieceSink*>(this), std::move(fd), std::move(mover),
                                 options_.io_timeout, options_.transport == TransportKind::kShm);
    }
    std::lock_guard<std::mutex> lock(links_mu_);
    int64_t id = next_peer_id_++;
    links_[id] = std::move(link);
    return PeerId(id);
  }

  Status close_segment(PeerId peer) override {
    std::shared_ptr<Link> link;
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      auto it = links_.find(peer.value());
      if (it == links_.end())
        return not_found("unknown peer " + std::to_string(peer.value()));
      link = std::move(it->second);
      links_.erase(it);
    }
    link->shutdown();
    return Status::ok();
  }

  Result<BatchId> submit(PeerId peer, std::span<const TransferOp> ops, Deadline deadline) override {
    if (ops.empty())
      return invalid_argument("empty batch");
    for (size_t i = 0; i < ops.size(); ++i) {
      const TransferOp& op = ops[i];
      if (op.length == 0 || op.local_addr == nullptr ||
          (op.kind != OpKind::kRead && op.kind != OpKind::kWrite)) {
        return invalid_argument("op " + std::to_string(i) +
                                ": needs a kind, a local address and a non-zero length");
      }
      auto local = reinterpret_cast<uintptr_t>(op.local_addr);
      if (local + op.length < local) {
        return invalid_argument("op " + std::to_string(i) + ": local range wraps around");
      }
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Link> link, find_link(peer));
    if (link->is_broken())
      return unavailable("link to peer " + std::to_string(peer.value()) +
                         " is broken; open the segment again");
    auto batch = std::make_shared<Batch>();
    batch->peer = peer.value();
    batch->deadline = deadline;
    batch->op_status.resize(ops.size());
    batch->op_bytes.resize(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      batch->op_bytes[i] = ops[i].length;
    }
    std::vector<Piece> pieces = make_pieces(batch, ops);
    batch->num_pending_pieces = static_cast<int64_t>(pieces.size());
    {
      std::lock_guard<std::mutex> lock(batches_mu_);
      batch->id = next_batch_id_++;
      batches_[batch->id] = batch;
    }
    BatchId id(batch->id);
    link->enqueue(std::move(pieces));
    return id;
  }

  Result<BatchStatus> poll(BatchId id) override {
    std::shared_ptr<Batch> b;
    {
      std::lock_guard<std::mutex> lock(batches_mu_);
      auto it = batches_.find(id.value());
      if (it == batches_.end())
        return not_found("unknown batch " + std::to_string(id.value()));
      b = it->second;
      if (b->is_done)
        return snapshot_locked(*b);
    }
    if (b->deadline.is_expired())
      expire(*b);
    std::lock_guard<std::mutex> lock(batches_mu_);
    return snapshot_locked(*b);
  }

  Status wait(BatchId id, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(batches_mu_);
    auto it = batches_.find(id.value());
    if (it == batches_.end())
      return not_found("unknown batch " + std::to_string(id.value()));
    std::shared_ptr<Batch> b = it->second;
    for (;;) {
      Deadline until = earliest(deadline, b->deadline);
      batches_cv_.wait_until(lock, until.when(), [&] { return b->is_done; });
      if (b->is_done)
        return b->status;
      if (b->deadline.is_expired()) {
        lock.unlock();
        expire(*b);
        lock.lock();
        // The link's threads finish every piece promptly once it is broken.
        batches_cv_.wait(lock, [&] { return b->is_done; });
        return b->status;
      }
      if (deadline.is_expired())
        return deadline_exceeded("batch still running");
    }
  }

  void release(BatchId id) override {
    std::lock_guard<std::mutex> lock(batches_mu_);
    auto it = batches_.find(id.value());
    if (it == batches_.end())
      return;
    if (it->second->is_done) {
      batches_.erase(it);
    } else {
      it->second->is_released = true;
    }
  }

  Result<RemoteRegionView> view_region(PeerId peer, RegionId region, Deadline deadline) override {
    if (options_.transport != TransportKind::kShm)
      return unimplemented("region views need the shm transport, this engine uses " +
                           std::string(transport_name(options_.transport)));
    ASSIGN_OR_RETURN(std::shared_ptr<Link> link, find_link(peer));
    auto view = link->view(region);
    if (view.is_ok() || view.status().code() != StatusCode::kNotFound)
      return view;
    // Not granted yet: a 1-byte READ leases the region, and the grant maps it.
    uint8_t probe = 0;
    TransferOp op{OpKind::kRead, &probe, region, 0, 1};
    ASSIGN_OR_RETURN(BatchId batch, submit(peer, std::span(&op, 1), deadline));
    Status waited = wait(batch, deadline);
    release(batch);
    RETURN_IF_ERROR(waited);
    return link->view(region);
  }

  Status notify(PeerId peer, std::string_view message, Deadline deadline) override {
    if (message.size() > kMaxNotificationBytes)
      return invalid_argument("notification too large");
    ASSIGN_OR_RETURN(std::shared_ptr<Link> link, find_link(peer));
    return link->notify(message, deadline);
  }

 private:
  Result<std::shared_ptr<Link>> find_link(PeerId peer) {
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = links_.find(peer.value());
    if (it == links_.end())
      return not_found("unknown peer " + std::to_string(peer.value()));
    return it->second;
  }

  // A batch past its deadline: its link is stuck or slow. Break it so that no byte moves for
  // this batch after it is reported failed.
  void expire(const Batch& b) {
    auto link = find_link(PeerId(b.peer));
    if (link.is_ok()) {
      (*link)->fail(deadline_exceeded("batch deadline passed; link to peer closed"));
    }
  }

  BatchStatus snapshot_locked(const Batch& b) const {
    BatchStatus s;
    s.is_done = b.is_done;
    s.status = b.status;
    s.op_status = b.op_status;
    s.num_bytes = b.num_bytes;
    return s;
  }

  // Sorts the ops by (kind, region, offset), merges runs that are adjacent both locally and
  // remotely, and (tcp) cuts runs into pieces of at most kMaxPieceBytes.
  std::vector<Piece> make_pieces(const std::shared_ptr<Batch>& batch,
                                 std::span<const TransferOp> ops) {
    std::vector<uint32_t> order(ops.size());
    for (uint32_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const TransferOp& x = ops[a];
      const TransferOp& y = ops[b];
      if (x.kind != y.kind)
        return x.kind < y.kind;
      if (x.remote_region != y.remote_region)
        return x.remote_region < y.remote_region;
      return x.remote_offset < y.remote_offset;
    });
    std::vector<Piece> runs;
    std::vector<std::vector<uint32_t>> run_ops;
    for (uint32_t i : order) {
      const TransferOp& op = ops[i];
      auto* local = static_cast<uint8_t*>(op.local_addr);
      if (!runs.empty()) {
        Piece& last = runs.back();
        bool adjacent = last.kind == op.kind && last.region == op.remote_region &&
                        last.remote_offset + last.length == op.remote_offset &&
                        last.remote_offset + last.length >= last.remote_offset &&
                        last.local + last.length == local;
        if (adjacent) {
          last.length += op.length;
          run_ops.back().push_back(i);
          continue;
        }
      }
      Piece p;
      p.batch = batch;
      p.kind = op.kind;
      p.local = local;
      p.region = op.remote_region;
      p.remote_offset = op.remote_offset;
      p.length = op.length;
      runs.push_back(std::move(p));
      run_ops.push_back({i});
    }
    std::vector<Piece> pieces;
    bool split = options_.transport == TransportKind::kTcp;
    for (size_t r = 0; r < runs.size(); ++r) {
      auto op_list = std::make_shared<const std::vector<uint32_t>>(std::move(run_ops[r]));
      Piece& run = runs[r];
      // A run whose offset + length overflows is sent as one piece; the target refuses it.
      bool wraps = run.remote_offset + run.length < run.remote_offset;
      if (!split || wraps || run.length <= wire::kMaxPieceBytes) {
        run.ops = op_list;
        pieces.push_back(std::move(run));
        continue;
      }
      for (uint64_t off = 0; off < run.length; off += wire::kMaxPieceBytes) {
        Piece p = run;
        p.ops = op_list;
        p.local = run.local + off;
        p.remote_offset = run.remote_offset + off;
        p.length = std::min<uint64_t>(wire::kMaxPieceBytes, run.length - off);
        pieces.push_back(std::move(p));
      }
    }
    return pieces;
  }

  void finish(Piece& piece, const Status& status) override {
    std::lock_guard<std::mutex> lock(batches_mu_);
    Batch& b = *piece.batch;
    CRESCENT_CHECK(!b.is_done) << "piece finished after its batch";
    for (uint32_t i : *piece.ops) {
      if (!status.is_ok() && b.op_status[i].is_ok())
        b.op_status[i] = status;
    }
    if (--b.num_pending_pieces > 0)
      return;
    b.is_done = true;
    for (size_t i = 0; i < b.op_status.size(); ++i) {
      if (b.op_status[i].is_ok()) {
        b.num_bytes += b.op_bytes[i];
      } else if (b.status.is_ok()) {
        b.status = b.op_status[i].with_context("op " + std::to_string(i));
      }
    }
    if (b.is_released)
      batches_.erase(b.id);
    batches_cv_.notify_all();
  }

  EngineOptions options_;
  std::string address_;
  RegionTable regions_;
  std::unique_ptr<UcxContext> ucx_;
  std::unique_ptr<TransferServer> server_;

  std::mutex links_mu_;
  std::map<int64_t, std::shared_ptr<Link>> links_;
  int64_t next_peer_id_ = 1;

  std::mutex batches_mu_;
  std::condition_variable batches_cv_;
  std::unordered_map<int64_t, std::shared_ptr<Batch>> batches_;
  int64_t next_batch_id_ = 1;
};

}  // namespace

std::string_view transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kUcx:
      return "ucx";
  }
  return "unknown";
}

Result<TransportKind> parse_transport(std::string_view name) {
  if (name == "shm")
    return TransportKind::kShm;
  if (name == "tcp")
    return TransportKind::kTcp;
  if (name == "ucx")
    return TransportKind::kUcx;
  return invalid_argument("unknown transport '" + std::string(name) + "' (shm, tcp or ucx)");
}

TransportCapabilities capabilities(TransportKind kind) {
  TransportCapabilities c;
  switch (kind) {
    case TransportKind::kShm:
      c.is_one_sided = true;
      c.needs_shared_memory = true;
      break;
    case TransportKind::kTcp:
      c.supports_remote_host = true;
      c.uses_multiple_connections = true;
      break;
    case TransportKind::kUcx:
      c.supports_remote_host = true;
      c.is_one_sided = true;
      break;
  }
  return c;
}

bool is_transport_available(TransportKind kind) {
  return kind != TransportKind::kUcx || CRESCENT_HAVE_UCX;
}

std::vector<TransportKind> available_transports() {
  std::vector<TransportKind> kinds;
  for (TransportKind kind : {TransportKind::kShm, TransportKind::kTcp, TransportKind::kUcx}) {
    if (is_transport_available(kind)) {
      kinds.push_back(kind);
    }
  }
  return kinds;
}

std::vector<std::string> available_transport_names() {
  std::vector<std::string> names;
  for (TransportKind kind : available_transports()) {
    names.emplace_back(transport_name(kind));
  }
  return names;
}

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(EngineOptions options) {
  auto engine = std::make_unique<Engine>(std::move(options));
  RETURN_IF_ERROR(engine->start());
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace crescent::transfer
