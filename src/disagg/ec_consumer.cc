#include "disagg/ec_consumer.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/fence.h"
#include "core/logging.h"
#include "core/prometheus.h"
#include "disagg/control_channel.h"
#include "disagg/protocol.h"
#include "net/auth/handshake.h"
#include "net/socket.h"

namespace crescent::disagg {
namespace {

using ec_protocol::MessageType;

// release(): how long the background thread spends on one encoder.
constexpr std::chrono::milliseconds kReleaseTimeout{2'000};

// EC_RELEASE of a ref; located: it confirms a READ at the ref's location (ec_protocol.h).
ec_protocol::Release release_message(const EcTensorRef& r, bool located) {
  ec_protocol::Release release{r.reservation_id, r.mm_hash};
  if (located) {
    release.has_location = true;
    release.instance = r.instance;
    release.region_id = r.region_id;
    release.offset = r.offset;
  }
  return release;
}

std::string encoder_name(const EcTensorRef& ref) {
  return "encoder " + ref.engine_id + " at " + ref.worker_addr;
}

// One control connection to one encoder, used by one fetch at a time: request/response over a
// ControlChannel whose reader thread queues every frame but heartbeat acks.
class Connection {
 public:
  // `lost` is set when the connection ends without this side closing it (the encoder died,
  // went silent for 3 heartbeat intervals, or closed it): the shm fast path stops trusting
  // the encoder until a control-connection pull succeeds again.
  static Result<std::unique_ptr<Connection>> open(const EcTensorRef& ref,
                                                  const EcConsumerOptions& options,
                                                  Deadline deadline,
                                                  const std::shared_ptr<std::atomic<bool>>& lost);
  ~Connection() {
    is_closing_ = true;
    channel_.reset();  // aborts and joins
  }

  void send(MessageType type, std::string payload) {
    channel_->send(static_cast<protocol::MessageType>(type), std::move(payload));
  }
  // The next frame, or why none will come (closed: Unavailable; deadline: DeadlineExceeded).
  Result<net::Frame> next(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline.when(), [&] { return !inbox_.empty() || is_closed_; });
    if (!inbox_.empty()) {
      net::Frame f = std::move(inbox_.front());
      inbox_.pop_front();
      return f;
    }
    if (is_closed_)
      return close_reason_;
    return deadline_exceeded("no answer from " + name_ + " before the deadline");
  }
  bool is_open() const { return channel_->is_open(); }
  bool is_finished() const { return channel_->is_finished(); }
  void close(const Status& why) {
    is_closing_ = true;
    channel_->close(why);
  }
  const std::string& name() const { return name_; }
  const std::string& engine_id() const { return hello_ok_.engine_id; }
  const std::string& segment_descriptor() const { return hello_ok_.segment_descriptor; }

 private:
  explicit Connection(std::string name) : name_(std::move(name)) {}

  std::string name_;
  ec_protocol::HelloOk hello_ok_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<net::Frame> inbox_;         // GUARDED_BY(mu_)
  bool is_closed_ = false;               // GUARDED_BY(mu_)
  Status close_reason_;                  // GUARDED_BY(mu_)
  std::atomic<bool> is_closing_{false};  // this side closes it
  std::unique_ptr<ControlChannel> channel_;
};

Result<std::unique_ptr<Connection>> Connection::open(
    const EcTensorRef& ref, const EcConsumerOptions& options, Deadline deadline,
    const std::shared_ptr<std::atomic<bool>>& lost) {
  const std::string name = encoder_name(ref);
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(net::parse_host_port(ref.worker_addr.substr(6), &host, &port));
  auto fd = net::connect_tcp(host, port, deadline);
  if (!fd.is_ok())
    return unavailable("cannot connect to " + name + ": " + fd.status().message());
  RETURN_IF_ERROR(net::auth::authenticate_to_server(*fd, options.auth_token, name, deadline));
  auto conn = std::unique_ptr<Connection>(new Connection(name));
  Connection* c = conn.get();
  ControlChannel::Options co;
  co.peer_name = name;
  co.heartbeat_interval = options.heartbeat_interval;
  co.sends_heartbeats = true;
  co.close_grace = std::chrono::milliseconds(1000);
  co.io_timeout = 3 * options.heartbeat_interval;
  c->channel_ = std::make_unique<ControlChannel>(
      std::move(*fd), co,
      [c](ControlChannel&, net::Frame f) {
        if (f.type == static_cast<uint16_t>(MessageType::kHeartbeatAck))
          return;
        std::lock_guard<std::mutex> lock(c->mu_);
        c->inbox_.push_back(std::move(f));
        c->cv_.notify_all();
      },
      [c, lost](ControlChannel&, const Status& why) {
        if (!c->is_closing_)
          lost->store(true);
        std::lock_guard<std::mutex> lock(c->mu_);
        c->is_closed_ = true;
        c->close_reason_ = unavailable(why.message());
        c->cv_.notify_all();
      });
  ec_protocol::Hello hello;
  hello.compat = options.compat;
  hello.consumer_name = options.name.substr(0, ec_protocol::kMaxIdBytes);
  hello.heartbeat_interval_ms = static_cast<uint32_t>(options.heartbeat_interval.count());
  c->send(MessageType::kHello, ec_protocol::encode(hello));
  ASSIGN_OR_RETURN(net::Frame frame, c->next(deadline));
  RETURN_IF_ERROR(net::auth::refusal_in_reply(frame, name));
  if (frame.type == static_cast<uint16_t>(MessageType::kRefused)) {
    auto refused = ec_protocol::decode_refused(frame.payload);
    if (!refused.is_ok())
      return refused.status().with_context(name);
    if (refused->kind == ec_protocol::RefusalKind::kCompatibility) {
      return failed_precondition("compatibility mismatch with " + name + ": " + refused->message);
    }
    return failed_precondition(name + " refused the connection: " + refused->message);
  }
  if (frame.type != static_cast<uint16_t>(MessageType::kHelloOk)) {
    return data_loss(name + " answered EC_HELLO with " +
                     ec_protocol::message_type_name(frame.type));
  }
  auto ok = ec_protocol::decode_hello_ok(frame.payload);
  if (!ok.is_ok())
    return ok.status().with_context(name);
  if (ok->engine_id != ref.engine_id) {
    return failed_precondition(ref.worker_addr + " is encoder " + ok->engine_id + ", not " +
                               ref.engine_id);
  }
  c->hello_ok_ = std::move(*ok);
  return conn;
}

}  // namespace

class EcConsumer::Impl {
 public:
  explicit Impl(EcConsumerOptions options) : options_(std::move(options)) {}
  ~Impl();

  Status start();
  Status fetch(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
               Deadline deadline);
  // were_read: the refs' bytes were copied (mapped copies), so their EC_RELEASE carries the
  // location and the encoder counts a pull; otherwise they are given up unread.
  void release(std::span<const EcTensorRef> refs, bool were_read = false);
  EcConsumerMetrics metrics() const;
  std::string render_metrics(const std::string& model_name) const;

 private:
  // The transfer segment of one encoder, opened once and shared by its fetches.
  struct Segment {
    std::mutex mu;
    std::string descriptor;                // GUARDED_BY(mu)
    std::optional<transfer::PeerId> peer;  // GUARDED_BY(mu)
    // Who answered the EC_HELLO (compatible) that opened `peer`.
    std::string engine_id;  // GUARDED_BY(mu)
    // shm: the encoder's pool regions mapped here, for copy_mapped().
    std::map<int64_t, transfer::RemoteRegionView> views;  // GUARDED_BY(mu)
  };

  // shm fast path: copies each ref of `indices` whose encoder's segment is open (after a
  // compatible EC_HELLO from its engine id), that carries a stamp and has not expired, straight
  // out of the encoder's mapped pool, and checks the copy against the stamp (ec_tensor_pool.h).
  // Returns the indices it did not serve, for the control-connection path; those it served are
  // released asynchronously.
  std::vector<size_t> copy_mapped(std::span<const EcTensorRef> refs,
                                  std::span<const std::span<float>> dsts,
                                  const std::vector<size_t>& indices, Deadline deadline);
  // One encoder's share of a fetch: indices into refs/dsts.
  Status fetch_group(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
                     const std::vector<size_t>& indices, Deadline deadline);
  Status pull(Connection& conn, std::span<const EcTensorRef> refs,
              std::span<const std::span<float>> dsts, const std::vector<size_t>& indices,
              Deadline deadline, std::vector<bool>* released);
  Result<std::unique_ptr<Connection>> take_connection(const EcTensorRef& ref, Deadline deadline);
  // Whether the encoder at worker_addr was lost since a control-connection pull last
  // succeeded (see Connection::open); created false.
  std::shared_ptr<std::atomic<bool>> lost_flag(const std::string& worker_addr);
  void return_connection(const std::string& worker_addr, std::unique_ptr<Connection> conn);
  void park_closing(std::unique_ptr<Connection> conn);
  Result<transfer::PeerId> segment_for(const Connection& conn, const std::string& worker_addr,
                                       Deadline deadline);
  // Closes the encoder's segment if it is still `peer` (stops a READ that did not finish).
  void drop_segment(const std::string& worker_addr, transfer::PeerId peer);
  void release_loop();
  struct ReleaseJob {
    std::vector<EcTensorRef> refs;
    bool were_read = false;
  };
  void release_now(const ReleaseJob& job);
  // refs with worker_addr replaced by what their bootstrap_addr says of their engine_id.
  std::vector<EcTensorRef> resolve_addrs(std::span<const EcTensorRef> refs, Deadline deadline);

  EcConsumerOptions options_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  std::thread release_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;                                                  // release queue
  bool is_stopping_ = false;                                                    // GUARDED_BY(mu_)
  std::deque<ReleaseJob> release_queue_;                                        // GUARDED_BY(mu_)
  std::map<std::string, std::vector<std::unique_ptr<Connection>>> idle_;        // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<Connection>> closing_;                            // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<Segment>> segments_;                    // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> lost_;              // GUARDED_BY(mu_)
  EcConsumerMetrics metrics_;                                                   // GUARDED_BY(mu_)
  prometheus::Histogram fetch_seconds_{prometheus::latency_buckets_seconds()};  // GUARDED_BY(mu_)
};

Status EcConsumer::Impl::start() {
  if (options_.timeout.count() <= 0)
    return invalid_argument("EcConsumerOptions.timeout must be positive");
  if (options_.heartbeat_interval.count() < 10 || options_.heartbeat_interval.count() > 600'000)
    return invalid_argument("EcConsumerOptions.heartbeat_interval must be 10..600000 ms");
  if (options_.max_idle_connections < 0)
    return invalid_argument("EcConsumerOptions.max_idle_connections must not be negative");
  if (!transfer::is_transport_available(options_.transport)) {
    return invalid_argument("EcConsumerOptions.transport: " +
                            std::string(transfer::transport_name(options_.transport)) +
                            " is not available in this build");
  }
  transfer::EngineOptions eo;
  eo.transport = options_.transport;
  eo.listen_host = options_.listen_host;
  eo.token = options_.auth_token;
  ASSIGN_OR_RETURN(engine_, transfer::TransferEngine::create(eo));
  release_thread_ = std::thread([this] { release_loop(); });
  return Status::ok();
}

EcConsumer::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
    cv_.notify_all();
  }
  if (release_thread_.joinable())
    release_thread_.join();
  std::map<std::string, std::vector<std::unique_ptr<Connection>>> idle;
  std::vector<std::unique_ptr<Connection>> closing;
  std::map<std::string, std::shared_ptr<Segment>> segments;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle.swap(idle_);
    closing.swap(closing_);
    segments.swap(segments_);
  }
  idle.clear();
  closing.clear();
  if (engine_) {
    for (auto& [addr, s] : segments) {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->peer.has_value())
        (void)engine_->close_segment(*s->peer);
    }
  }
  engine_.reset();
}

Result<std::unique_ptr<Connection>> EcConsumer::Impl::take_connection(const EcTensorRef& ref,
                                                                      Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(ref.worker_addr);
    while (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<Connection> conn = std::move(it->second.back());
      it->second.pop_back();
      if (conn->is_open() && conn->engine_id() == ref.engine_id)
        return conn;
      closing_.push_back(std::move(conn));
    }
    ++metrics_.num_connections_opened;
  }
  auto conn = Connection::open(ref, options_, deadline, lost_flag(ref.worker_addr));
  if (!conn.is_ok())
    lost_flag(ref.worker_addr)->store(true);
  return conn;
}

std::shared_ptr<std::atomic<bool>> EcConsumer::Impl::lost_flag(const std::string& worker_addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& flag = lost_[worker_addr];
  if (!flag)
    flag = std::make_shared<std::atomic<bool>>(false);
  return flag;
}

void EcConsumer::Impl::return_connection(const std::string& worker_addr,
                                         std::unique_ptr<Connection> conn) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& list = idle_[worker_addr];
  if (!is_stopping_ && conn->is_open() &&
      list.size() < static_cast<size_t>(options_.max_idle_connections)) {
    list.push_back(std::move(conn));
    return;
  }
  conn->close(cancelled("idle connection not kept"));
  closing_.push_back(std::move(conn));
}

void EcConsumer::Impl::park_closing(std::unique_ptr<Connection> conn) {
  std::vector<std::unique_ptr<Connection>> finished;
  std::lock_guard<std::mutex> lock(mu_);
  closing_.push_back(std::move(conn));
  for (auto it = closing_.begin(); it != closing_.end();) {
    if ((*it)->is_finished()) {
      finished.push_back(std::move(*it));
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
  // `finished` is destroyed after the lock is released (declared first); their threads ended.
}

Result<transfer::PeerId> EcConsumer::Impl::segment_for(const Connection& conn,
                                                       const std::string& worker_addr,
                                                       Deadline deadline) {
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = segments_[worker_addr];
    if (!slot)
      slot = std::make_shared<Segment>();
    seg = slot;
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  if (seg->peer.has_value() && seg->descriptor == conn.segment_descriptor())
    return *seg->peer;
  if (seg->peer.has_value()) {
    (void)engine_->close_segment(*seg->peer);
    seg->peer.reset();
  }
  auto desc = transfer::SegmentDescriptor::parse(conn.segment_descriptor());
  if (!desc.is_ok())
    return desc.status().with_context(conn.name() + ": bad transfer segment descriptor");
  if (desc->transport != engine_->transport()) {
    return failed_precondition(
        "transport mismatch with " + conn.name() + ": " +
        std::string(transfer::transport_name(engine_->transport())) + " at the prefill worker, " +
        std::string(transfer::transport_name(desc->transport)) + " at the encoder");
  }
  auto peer = engine_->open_segment(*desc, deadline);
  if (!peer.is_ok()) {
    return unavailable("cannot open the transfer segment of " + conn.name() + ": " +
                       peer.status().message());
  }
  seg->descriptor = conn.segment_descriptor();
  seg->peer = *peer;
  seg->engine_id = conn.engine_id();
  seg->views.clear();
  return *peer;
}

void EcConsumer::Impl::drop_segment(const std::string& worker_addr, transfer::PeerId peer) {
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(worker_addr);
    if (it == segments_.end())
      return;
    seg = it->second;
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  if (seg->peer.has_value() && *seg->peer == peer) {
    // Fails the link's unfinished batches and joins its threads: no byte moves afterwards.
    (void)engine_->close_segment(peer);
    seg->peer.reset();
    seg->views.clear();
  }
}

Status EcConsumer::Impl::pull(Connection& conn, std::span<const EcTensorRef> refs,
                              std::span<const std::span<float>> dsts,
                              const std::vector<size_t>& indices, Deadline deadline,
                              std::vector<bool>* released) {
  const std::string& addr = refs[indices[0]].worker_addr;
  ASSIGN_OR_RETURN(transfer::PeerId peer, segment_for(conn, addr, deadline));
  std::map<uint64_t, size_t> slot_of;  // reservation id -> position in indices
  std::vector<transfer::TransferOp> ops(indices.size());
  size_t num_acquiring = 0;
  for (size_t k = 0; k < indices.size(); ++k) {
    const EcTensorRef& r = refs[indices[k]];
    slot_of[r.reservation_id] = k;
    if (r.has_location) {
      // Read at once; the located EC_RELEASE below says whether the bytes were stable.
      ops[k] = transfer::TransferOp{transfer::OpKind::kRead, dsts[indices[k]].data(),
                                    transfer::RegionId(r.region_id), r.offset, r.num_bytes};
      continue;
    }
    ++num_acquiring;
    conn.send(MessageType::kAcquire,
              ec_protocol::encode(ec_protocol::Acquire{r.reservation_id, r.mm_hash, r.num_bytes}));
  }
  Status first_failure;
  for (size_t n = 0; n < num_acquiring; ++n) {
    ASSIGN_OR_RETURN(net::Frame f, conn.next(deadline));
    if (f.type == static_cast<uint16_t>(MessageType::kAcquired)) {
      ASSIGN_OR_RETURN(auto m, ec_protocol::decode_acquired(f.payload));
      auto it = slot_of.find(m.reservation_id);
      if (it == slot_of.end() || refs[indices[it->second]].has_location)
        return data_loss(conn.name() + " acquired a reservation that was not asked for");
      const size_t k = it->second;
      const EcTensorRef& r = refs[indices[k]];
      if (m.num_bytes != r.num_bytes) {
        return data_loss(conn.name() + " acquired " + std::to_string(m.num_bytes) + " bytes for " +
                         r.mm_hash + ", expected " + std::to_string(r.num_bytes));
      }
      ops[k] = transfer::TransferOp{transfer::OpKind::kRead, dsts[indices[k]].data(),
                                    transfer::RegionId(m.region_id), m.offset, m.num_bytes};
    } else if (f.type == static_cast<uint16_t>(MessageType::kAcquireFailed)) {
      ASSIGN_OR_RETURN(auto m, ec_protocol::decode_acquire_failed(f.payload));
      if (first_failure.is_ok()) {
        first_failure = not_found(m.message);
      }
    } else {
      return data_loss(conn.name() + " answered EC_ACQUIRE with " +
                       ec_protocol::message_type_name(f.type));
    }
  }
  RETURN_IF_ERROR(first_failure);
  auto batch = engine_->submit(peer, ops, deadline);
  if (!batch.is_ok()) {
    drop_segment(addr, peer);
    return unavailable("reading from " + conn.name() + ": " + batch.status().message());
  }
  Status waited = engine_->wait(*batch, deadline);
  auto polled = engine_->poll(*batch);
  engine_->release(*batch);
  if (!waited.is_ok() || !polled.is_ok() || !polled->is_done || !polled->status.is_ok()) {
    drop_segment(addr, peer);
    Status why = !waited.is_ok()    ? waited
                 : !polled.is_ok()  ? polled.status()
                 : !polled->is_done ? deadline_exceeded("not done")
                                    : polled->status;
    if (why.code() == StatusCode::kDeadlineExceeded)
      return deadline_exceeded("reading from " + conn.name() + ": " + why.message());
    return unavailable("reading from " + conn.name() + ": " + why.message());
  }
  // Every release at once: one round trip for the group, whatever its size.
  for (size_t i : indices) {
    conn.send(MessageType::kRelease,
              ec_protocol::encode(release_message(refs[i], refs[i].has_location)));
  }
  for (size_t n = 0; n < indices.size(); ++n) {
    auto f = conn.next(deadline);
    if (!f.is_ok()) {
      // The bytes were read, but nothing proves the pin held throughout: do not trust them.
      return f.status().with_context("before " + conn.name() + " confirmed the pull");
    }
    if (f->type != static_cast<uint16_t>(MessageType::kReleased)) {
      return data_loss(conn.name() + " answered EC_RELEASE with " +
                       ec_protocol::message_type_name(f->type));
    }
    ASSIGN_OR_RETURN(auto m, ec_protocol::decode_released(f->payload));
    auto it = slot_of.find(m.reservation_id);
    if (it == slot_of.end())
      return data_loss(conn.name() + " released a reservation that was not asked for");
    if ((*released)[it->second])
      return data_loss(conn.name() + " released reservation " + std::to_string(m.reservation_id) +
                       " twice");
    (*released)[it->second] = true;
    if (m.was_held)
      continue;
    const EcTensorRef& r = refs[indices[it->second]];
    if (!r.has_location) {
      return data_loss(conn.name() + " no longer held reservation " +
                       std::to_string(m.reservation_id) + " when it was released");
    }
    // Not pinned: the reservation ended before the READ was confirmed, so the entry may have
    // been evicted and its bytes reused during the READ. Read the other answers (the
    // connection stays in step), then fail.
    if (first_failure.is_ok()) {
      first_failure = not_found(
          conn.name() + ": reservation " + std::to_string(m.reservation_id) + " of " + r.mm_hash +
          " expired or was released before the read was confirmed (or was published by an "
          "earlier instance of the encoder); its bytes are not used");
    }
  }
  return first_failure;
}

std::vector<size_t> EcConsumer::Impl::copy_mapped(std::span<const EcTensorRef> refs,
                                                  std::span<const std::span<float>> dsts,
                                                  const std::vector<size_t>& indices,
                                                  Deadline deadline) {
  if (engine_->transport() != transfer::TransportKind::kShm ||
      lost_flag(refs[indices[0]].worker_addr)->load()) {
    return indices;
  }
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(refs[indices[0]].worker_addr);
    if (it == segments_.end())
      return indices;
    seg = it->second;
  }
  const int64_t now_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  std::vector<size_t> rest;
  std::vector<EcTensorRef> served;
  uint64_t num_stale = 0;
  for (size_t i : indices) {
    const EcTensorRef& r = refs[i];
    // An expired reservation takes the slow path, which reports it as the encoder sees it.
    if (!r.has_location || r.stamp == 0 || r.expires_at_unix_ms <= now_unix_ms) {
      rest.push_back(i);
      continue;
    }
    transfer::RemoteRegionView view;
    {
      std::lock_guard<std::mutex> lock(seg->mu);
      if (!seg->peer.has_value() || seg->engine_id != r.engine_id) {
        rest.push_back(i);
        continue;
      }
      auto it = seg->views.find(r.region_id);
      if (it == seg->views.end()) {
        auto v = engine_->view_region(*seg->peer, transfer::RegionId(r.region_id), deadline);
        if (!v.is_ok()) {
          rest.push_back(i);
          continue;
        }
        it = seg->views.emplace(r.region_id, std::move(*v)).first;
      }
      view = it->second;
    }
    if (r.offset < kEcStampBytes || r.offset > view.length ||
        r.num_bytes > view.length - r.offset) {
      rest.push_back(i);
      continue;
    }
    // Seqlock read against the encoder's stamp (ec_tensor_pool.h): the mapping is writable
    // shared memory, so the atomic loads are well defined; they never write.
    auto& stamp =
        *reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(view.data) + r.offset - kEcStampBytes);
    if (std::atomic_ref<uint64_t>(stamp).load(std::memory_order_acquire) != r.stamp) {
      ++num_stale;
      rest.push_back(i);
      continue;
    }
    std::memcpy(dsts[i].data(), view.data + r.offset, r.num_bytes);
    memory_fence(std::memory_order_acquire);
    if (std::atomic_ref<uint64_t>(stamp).load(std::memory_order_relaxed) != r.stamp) {
      ++num_stale;  // evicted during the copy: the slow path says what became of it
      rest.push_back(i);
      continue;
    }
    served.push_back(r);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.num_mapped_copies += served.size();
    metrics_.num_stale_mapped_copies += num_stale;
  }
  release(served, /*were_read=*/true);
  return rest;
}

Status EcConsumer::Impl::fetch_group(std::span<const EcTensorRef> refs,
                                     std::span<const std::span<float>> dsts,
                                     const std::vector<size_t>& all_indices, Deadline deadline) {
  const std::vector<size_t> indices = copy_mapped(refs, dsts, all_indices, deadline);
  if (indices.empty())
    return Status::ok();
  const EcTensorRef& first = refs[indices[0]];
  auto conn = take_connection(first, deadline);
  if (!conn.is_ok()) {
    // Nothing was pinned; the encoder expires the reservations (or a later release() ends them).
    return conn.status();
  }
  std::vector<bool> released(indices.size(), false);
  Status s = pull(**conn, refs, dsts, indices, deadline, &released);
  if (s.is_ok()) {
    lost_flag(first.worker_addr)->store(false);  // alive and answering again
    return_connection(first.worker_addr, std::move(*conn));
    return s;
  }
  // Always release: queue EC_RELEASE for what is not confirmed, then close gracefully (queued
  // frames go out first); the encoder also releases what this connection pinned when it closes.
  for (size_t k = 0; k < indices.size(); ++k) {
    if (released[k])
      continue;
    const EcTensorRef& r = refs[indices[k]];
    (*conn)->send(MessageType::kRelease,
                  ec_protocol::encode(ec_protocol::Release{r.reservation_id, r.mm_hash}));
  }
  (*conn)->close(s);
  park_closing(std::move(*conn));
  return s;
}

std::vector<EcTensorRef> EcConsumer::Impl::resolve_addrs(std::span<const EcTensorRef> refs,
                                                         Deadline deadline) {
  std::vector<EcTensorRef> out(refs.begin(), refs.end());
  if (!options_.resolve)
    return out;
  for (EcTensorRef& r : out) {
    if (r.bootstrap_addr.empty() || is_disk_ref(r) || r.engine_id.empty())
      continue;
    auto addr = options_.resolve(r.bootstrap_addr, r.engine_id, deadline);
    if (addr.is_ok() && addr->substr(0, 6) == "tcp://") {
      r.worker_addr = *addr;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++metrics_.num_resolve_failures;
    }
    CRESCENT_LOG(kWarn) << "ec consumer: cannot resolve encoder " << r.engine_id << " through "
                        << r.bootstrap_addr << " ("
                        << (addr.is_ok() ? "not a tcp:// address: " + *addr
                                         : addr.status().to_string())
                        << "); using the item's worker_addr " << r.worker_addr;
  }
  return out;
}

Status EcConsumer::Impl::fetch(std::span<const EcTensorRef> in_refs,
                               std::span<const std::span<float>> dsts, Deadline deadline) {
  const TimePoint start = Clock::now();
  const Deadline d = Deadline::after(std::min<std::chrono::nanoseconds>(
      deadline.remaining(), std::chrono::nanoseconds(options_.timeout)));
  const std::vector<EcTensorRef> resolved = resolve_addrs(in_refs, d);
  const std::span<const EcTensorRef> refs(resolved);
  auto finish = [&](Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ++metrics_.num_fetches;
    metrics_.fetch_seconds_total += seconds;
    if (s.is_ok()) {
      fetch_seconds_.observe(seconds);
      metrics_.num_tensors += refs.size();
      for (const EcTensorRef& r : refs) {
        metrics_.num_bytes += r.num_bytes;
      }
    } else {
      ++metrics_.num_failures;
    }
    return s;
  };
  // Checked before anything moves; the reservations of refs that are well formed are still
  // released (asynchronously) when the call is refused.
  auto refuse = [&](Status s) {
    std::vector<EcTensorRef> valid;
    for (const EcTensorRef& r : refs) {
      if (validate_ec_tensor_ref(r, "ref").is_ok())
        valid.push_back(r);
    }
    release(valid);
    return finish(std::move(s));
  };
  if (refs.size() != dsts.size()) {
    return refuse(invalid_argument("EC fetch: " + std::to_string(refs.size()) + " refs but " +
                                   std::to_string(dsts.size()) + " destinations"));
  }
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < refs.size(); ++i) {
    const EcTensorRef& r = refs[i];
    const std::string where = "EC fetch: refs[" + std::to_string(i) + "]";
    if (Status v = validate_ec_tensor_ref(r, where); !v.is_ok())
      return refuse(v);
    if (is_disk_ref(r)) {
      return refuse(invalid_argument(where + ": " + r.worker_addr +
                                     " is a disk connector's directory; this prefill worker "
                                     "pulls through the transfer connector"));
    }
    if (static_cast<uint64_t>(dsts[i].size()) * sizeof(float) != r.num_bytes) {
      return refuse(invalid_argument(where + ": destination holds " +
                                     std::to_string(dsts[i].size()) + " floats, the tensor " +
                                     std::to_string(r.num_bytes / sizeof(float))));
    }
    if (options_.compat.hidden_size != 0 && r.shape[1] != options_.compat.hidden_size) {
      return refuse(failed_precondition(
          "compatibility mismatch with " + encoder_name(r) + ": hidden_size: " +
          std::to_string(options_.compat.hidden_size) + " at the prefill worker, " +
          std::to_string(r.shape[1]) + " in the encoder's tensor " + r.mm_hash));
    }
    auto& group = groups[r.worker_addr];
    for (size_t j : group) {
      if (refs[j].reservation_id == r.reservation_id)
        return refuse(invalid_argument(where + ": the same reservation twice in one fetch"));
    }
    group.push_back(i);
  }
  if (groups.empty())
    return finish(Status::ok());
  std::vector<Status> results(groups.size());
  std::vector<std::thread> threads;
  size_t g = 0;
  const std::vector<size_t>* first_group = nullptr;
  for (auto& [addr, indices] : groups) {
    if (g == 0) {
      first_group = &indices;
    } else {
      threads.emplace_back(
          [&, g, idx = &indices] { results[g] = fetch_group(refs, dsts, *idx, d); });
    }
    ++g;
  }
  results[0] = fetch_group(refs, dsts, *first_group, d);
  for (auto& t : threads) {
    t.join();
  }
  for (const Status& r : results) {
    if (!r.is_ok())
      return finish(r);
  }
  return finish(Status::ok());
}

void EcConsumer::Impl::release(std::span<const EcTensorRef> refs, bool were_read) {
  if (refs.empty())
    return;
  std::lock_guard<std::mutex> lock(mu_);
  if (is_stopping_)
    return;
  release_queue_.push_back(ReleaseJob{{refs.begin(), refs.end()}, were_read});
  cv_.notify_all();
}

void EcConsumer::Impl::release_loop() {
  for (;;) {
    ReleaseJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return is_stopping_ || !release_queue_.empty(); });
      if (is_stopping_)
        return;
      job = std::move(release_queue_.front());
      release_queue_.pop_front();
    }
    release_now(job);
  }
}

void EcConsumer::Impl::release_now(const ReleaseJob& job) {
  const std::vector<EcTensorRef> refs = resolve_addrs(job.refs, Deadline::after(kReleaseTimeout));
  std::map<std::string, std::vector<const EcTensorRef*>> groups;
  for (const EcTensorRef& r : refs) {
    if (validate_ec_tensor_ref(r, "ref").is_ok() && !is_disk_ref(r))
      groups[r.worker_addr].push_back(&r);
  }
  for (auto& [addr, group] : groups) {
    const Deadline deadline = Deadline::after(kReleaseTimeout);
    auto conn = take_connection(*group[0], deadline);
    if (!conn.is_ok()) {
      CRESCENT_LOG(kInfo) << "ec consumer: cannot release " << group.size()
                          << " reservation(s) (they will expire): " << conn.status().to_string();
      continue;
    }
    for (const EcTensorRef* r : group) {
      (*conn)->send(MessageType::kRelease,
                    ec_protocol::encode(release_message(*r, job.were_read && r->has_location)));
    }
    Status s;
    for (size_t n = 0; n < group.size() && s.is_ok(); ++n) {
      auto f = (*conn)->next(deadline);
      if (!f.is_ok()) {
        s = f.status();
      } else if (f->type != static_cast<uint16_t>(MessageType::kReleased)) {
        s = data_loss("unexpected " + ec_protocol::message_type_name(f->type));
      }
    }
    if (s.is_ok()) {
      return_connection(addr, std::move(*conn));
    } else {
      (*conn)->close(s);
      park_closing(std::move(*conn));
    }
  }
}

EcConsumerMetrics EcConsumer::Impl::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

std::string EcConsumer::Impl::render_metrics(const std::string& model_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string labels = "model_name=\"" + model_name + "\"";
  const std::string label = "{" + labels + "}";
  const std::string p = "crescent_ec_consumer_";
  std::string out;
  prometheus::SampleWriter w(&out, p, label);
  auto counter = [&](const char* name, const char* help, double v) { w.counter(name, help, v); };
  counter("fetches_total", "EC fetch calls (each pulls a request's image tensors).",
          static_cast<double>(metrics_.num_fetches));
  counter("failures_total", "EC fetch calls that failed.",
          static_cast<double>(metrics_.num_failures));
  counter("tensors_total", "Tensors pulled by successful fetches.",
          static_cast<double>(metrics_.num_tensors));
  counter("bytes_total", "Bytes pulled by successful fetches.",
          static_cast<double>(metrics_.num_bytes));
  counter("fetch_seconds_total", "Time spent in EC fetch calls, successful or not.",
          metrics_.fetch_seconds_total);
  counter("connections_opened_total", "Control connections opened to encoders.",
          static_cast<double>(metrics_.num_connections_opened));
  counter("mapped_copies_total",
          "Tensors copied straight out of an encoder's mapped pool (shm), checked by stamp, "
          "without a round trip.",
          static_cast<double>(metrics_.num_mapped_copies));
  counter("stale_mapped_copies_total",
          "Mapped copies whose stamp did not match (the entry was evicted); they took the "
          "control-connection path.",
          static_cast<double>(metrics_.num_stale_mapped_copies));
  counter("resolve_failures_total",
          "Encoder lookups through a bootstrap server that failed (the item's worker_addr was "
          "used).",
          static_cast<double>(metrics_.num_resolve_failures));
  prometheus::append_header(&out, p + "fetch_seconds", "histogram",
                            "Duration of successful EC fetch calls.");
  fetch_seconds_.render(p + "fetch_seconds", labels, &out);
  return out;
}

EcConsumer::EcConsumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EcConsumer::~EcConsumer() = default;

Result<std::unique_ptr<EcConsumer>> EcConsumer::create(EcConsumerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<EcConsumer>(new EcConsumer(std::move(impl)));
}

Status EcConsumer::fetch(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
                         Deadline deadline) {
  return impl_->fetch(refs, dsts, deadline);
}
void EcConsumer::release(std::span<const EcTensorRef> refs) {
  impl_->release(refs);
}
EcConsumerMetrics EcConsumer::metrics() const {
  return impl_->metrics();
}
std::string EcConsumer::render_metrics(const std::string& model_name) const {
  return impl_->render_metrics(model_name);
}

}  // namespace crescent::disagg
