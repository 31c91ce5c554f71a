#include "disagg/ec_producer.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/logging.h"
#include "core/prometheus.h"
#include "disagg/control_channel.h"
#include "disagg/ec_tensor_pool.h"
#include "disagg/protocol.h"
#include "net/socket.h"
#include "transfer/shared_memory.h"

namespace crescent::disagg {
namespace {

using ec_protocol::MessageType;

constexpr size_t kMaxConnections = 1024;
// Expired reservation ids remembered to tell a late consumer "expired" rather than "unknown".
constexpr size_t kNumRememberedExpiries = 4096;
// The pool drops a never-marked entry after this; the producer itself always marks or abandons
// once `write` returns, so this only bounds a writer that never returns.
constexpr std::chrono::hours kWriteTimeout{1};

void send(ControlChannel& ch, MessageType type, std::string payload) {
  // ControlChannel frames any 16-bit type; the EC types simply are not KV protocol enumerators.
  ch.send(static_cast<protocol::MessageType>(type), std::move(payload));
}

// Random, so that a restarted encoder (same engine id and address, reservation ids counted
// from the start again) never confirms a ref that an earlier instance published.
uint64_t new_instance_id() {
  std::random_device rd;
  const uint64_t v = ((uint64_t{rd()} << 32) | rd()) & kMaxEcInstance;
  return v == 0 ? 1 : v;
}

int64_t unix_ms_after(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             (std::chrono::system_clock::now() + d).time_since_epoch())
      .count();
}

}  // namespace

class EcProducer::Impl {
 public:
  explicit Impl(EcProducerOptions options)
      : options_(std::move(options)),
        instance_(new_instance_id()),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    CRESCENT_CHECK(wake_fd_.is_valid()) << "eventfd failed";
  }
  ~Impl() { shutdown(); }

  Status start();
  void shutdown();

  const std::string& worker_addr() const { return worker_addr_; }
  const std::string& engine_id() const { return options_.engine_id; }

  Result<EcTensorRef> publish(const std::string& mm_hash, int64_t num_tokens, int64_t hidden_size,
                              const std::function<Status(float* dst)>& write, Deadline deadline,
                              bool* was_cached);
  bool holds(const std::string& mm_hash) const;
  Status release(uint64_t reservation_id);
  void expire_now();
  EcProducerMetrics metrics() const;
  std::string render_metrics(const std::string& model_name) const;

 private:
  // One live pool reservation, by its ref id (pool id + 1, so that 0 never names one).
  struct Reservation {
    EcReservationId pool_id;
    std::string mm_hash;
    uint64_t offset = 0;
    uint64_t num_bytes = 0;
    uint64_t channel_id = 0;  // != 0: pulling, pinned for that connection
  };
  // One in-progress `write` of an mm_hash; concurrent publishes wait for it.
  struct Write {
    bool is_done = false;
    Status status;
  };
  struct Peer {
    std::shared_ptr<ControlChannel> channel;
    bool has_hello = false;      // GUARDED_BY(Impl::mu_)
    std::string consumer_name;   // GUARDED_BY(Impl::mu_)
    std::set<uint64_t> pulling;  // GUARDED_BY(Impl::mu_): ref ids acquired here
  };

  void accept_loop();
  void expiry_loop();
  void on_frame(ControlChannel& channel, const net::Frame& frame);
  void on_closed(ControlChannel& channel, const Status& reason);
  void handle_hello(Peer& peer, const std::string& payload);
  void handle_acquire_locked(Peer& peer, const ec_protocol::Acquire& m);
  void handle_release_locked(Peer& peer, const ec_protocol::Release& m);
  // Under mu_: ends a live reservation in the pool and the maps.
  void end_reservation_locked(std::unordered_map<uint64_t, Reservation>::iterator it);
  void remember_expired_locked(uint64_t ref_id);

  EcProducerOptions options_;
  const uint64_t instance_;  // refs' "instance"
  transfer::SharedBuffer memory_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  transfer::RegionId region_;
  bool is_region_registered_ = false;
  std::unique_ptr<EcTensorPool> pool_;
  net::Fd listener_;
  net::Fd wake_fd_;
  std::string worker_addr_;
  std::thread accept_thread_;
  std::thread expiry_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a write finished, space freed, stopping
  bool is_stopping_ = false;    // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, Reservation> reservations_;          // GUARDED_BY(mu_)
  std::unordered_map<std::string, std::shared_ptr<Write>> writes_;  // GUARDED_BY(mu_)
  std::map<uint64_t, std::shared_ptr<Peer>> peers_;                 // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<ControlChannel>> closed_channels_;    // GUARDED_BY(mu_)
  std::deque<uint64_t> expired_order_;                              // GUARDED_BY(mu_)
  std::unordered_set<uint64_t> expired_ids_;                        // GUARDED_BY(mu_)
  uint64_t num_publishes_ = 0;                                      // GUARDED_BY(mu_)
  uint64_t num_cache_hits_ = 0;                                     // GUARDED_BY(mu_)
  uint64_t num_pulls_served_ = 0;                                   // GUARDED_BY(mu_)
  uint64_t num_acquires_served_ = 0;                                // GUARDED_BY(mu_)
  uint64_t num_bytes_served_ = 0;                                   // GUARDED_BY(mu_)
  uint64_t num_releases_ = 0;                                       // GUARDED_BY(mu_)
  uint64_t num_refusals_ = 0;                                       // GUARDED_BY(mu_)
  uint64_t num_write_failures_ = 0;                                 // GUARDED_BY(mu_)
};

Status EcProducer::Impl::start() {
  const EcProducerOptions& o = options_;
  RETURN_IF_ERROR(protocol::validate_id(o.engine_id, "EcProducerOptions.engine_id"));
  if (o.pool_bytes < 4096)
    return invalid_argument("EcProducerOptions.pool_bytes must be at least 4096");
  if (o.reservation_timeout.count() <= 0)
    return invalid_argument("EcProducerOptions.reservation_timeout must be positive");
  if (o.full_pool_wait.count() < 0)
    return invalid_argument("EcProducerOptions.full_pool_wait must not be negative");
  if (o.heartbeat_interval.count() < 10)
    return invalid_argument("EcProducerOptions.heartbeat_interval must be at least 10 ms");
  if (!transfer::is_transport_available(o.transport)) {
    return invalid_argument(
        "EcProducerOptions.transport: " + std::string(transfer::transport_name(o.transport)) +
        " is not available in this build");
  }
  // Committed now, not page by page as images arrive: a consumer's first contact maps the whole
  // pool (MAP_POPULATE), which then finds every page in place (31 ms instead of 155 ms for the
  // default 256 MiB, measured), and the memory the pool needs is taken at start.
  ASSIGN_OR_RETURN(memory_, transfer::allocate_shared(o.pool_bytes, /*populate=*/true));
  transfer::EngineOptions eo;
  eo.transport = o.transport;
  eo.name = o.engine_id + "-ec";
  eo.listen_host = o.listen_host;
  eo.token = o.auth_token;
  ASSIGN_OR_RETURN(engine_, transfer::TransferEngine::create(eo));
  ASSIGN_OR_RETURN(region_, engine_->register_region(memory_.data(), o.pool_bytes));
  is_region_registered_ = true;
  EcTensorPoolOptions po;
  po.write_timeout = kWriteTimeout;
  po.stamp_entries = true;  // consumers on shm check their copies against it (ec_consumer.h)
  po.stamp_salt = instance_;
  ASSIGN_OR_RETURN(pool_, EcTensorPool::create(memory_.data(), o.pool_bytes, po));
  ASSIGN_OR_RETURN(listener_, net::listen_tcp(o.listen_host, o.listen_port));
  ASSIGN_OR_RETURN(int port, net::local_port(listener_));
  worker_addr_ = "tcp://" + o.listen_host + ":" + std::to_string(port);
  accept_thread_ = std::thread([this] { accept_loop(); });
  expiry_thread_ = std::thread([this] { expiry_loop(); });
  return Status::ok();
}

void EcProducer::Impl::shutdown() {
  std::vector<std::shared_ptr<Peer>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (is_stopping_ && !accept_thread_.joinable() && !expiry_thread_.joinable())
      return;
    is_stopping_ = true;
    cv_.notify_all();
    for (auto& [id, p] : peers_) {
      peers.push_back(p);
    }
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  if (accept_thread_.joinable())
    accept_thread_.join();
  if (expiry_thread_.joinable())
    expiry_thread_.join();
  // Not under mu_: on_closed takes it.
  for (auto& p : peers) {
    p->channel->abort(unavailable("encoder " + options_.engine_id + " is shutting down"));
  }
  for (auto& p : peers) {
    p->channel->join();
  }
  peers.clear();
  std::vector<std::shared_ptr<ControlChannel>> closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed.swap(closed_channels_);
    peers_.clear();
  }
  closed.clear();
  if (engine_ && is_region_registered_) {
    Status s = engine_->unregister_region(region_, Deadline::after_ms(5000));
    if (!s.is_ok()) {
      CRESCENT_LOG(kWarn) << "ec producer: unregistering the pool: " << s.to_string();
    }
    is_region_registered_ = false;
  }
  engine_.reset();
}

void EcProducer::Impl::accept_loop() {
  for (;;) {
    auto fd = net::accept_with_deadline(listener_, Deadline::after_ms(1000), wake_fd_.get());
    std::lock_guard<std::mutex> lock(mu_);
    if (is_stopping_)
      return;
    if (!fd.is_ok()) {
      if (fd.status().code() != StatusCode::kDeadlineExceeded) {
        CRESCENT_LOG(kWarn) << "ec producer: accept failed: " << fd.status().to_string();
      }
      continue;
    }
    if (peers_.size() >= kMaxConnections) {
      CRESCENT_LOG(kWarn) << "ec producer: refusing a connection: " << kMaxConnections
                          << " already open";
      continue;
    }
    ControlChannel::Options co;
    co.peer_name = "EC consumer of encoder " + options_.engine_id;
    co.heartbeat_interval = options_.heartbeat_interval;
    co.sends_heartbeats = false;
    co.close_grace = std::chrono::milliseconds(1000);
    co.io_timeout = 3 * options_.heartbeat_interval;
    co.auth_token = options_.auth_token;
    auto peer = std::make_shared<Peer>();
    // Built under mu_, so the handlers (which take mu_) find the peer registered.
    peer->channel = std::make_shared<ControlChannel>(
        std::move(*fd), co, [this](ControlChannel& ch, net::Frame f) { on_frame(ch, f); },
        [this](ControlChannel& ch, const Status& why) { on_closed(ch, why); });
    peers_[peer->channel->id()] = peer;
  }
}

void EcProducer::Impl::expiry_loop() {
  auto period = std::clamp<std::chrono::milliseconds>(options_.reservation_timeout / 10,
                                                      std::chrono::milliseconds(10),
                                                      std::chrono::milliseconds(1000));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, period, [&] { return is_stopping_; });
      if (is_stopping_)
        return;
    }
    expire_now();
  }
}

void EcProducer::Impl::remember_expired_locked(uint64_t ref_id) {
  if (expired_ids_.insert(ref_id).second)
    expired_order_.push_back(ref_id);
  while (expired_order_.size() > kNumRememberedExpiries) {
    expired_ids_.erase(expired_order_.front());
    expired_order_.pop_front();
  }
}

void EcProducer::Impl::expire_now() {
  std::vector<std::shared_ptr<ControlChannel>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    EcExpired expired = pool_->expire(Clock::now());
    for (const EcExpiredReservation& r : expired.reservations) {
      const auto ref_id = static_cast<uint64_t>(r.id.value()) + 1;
      // Pulling reservations are pinned (deadline max), so an expired one is never pulled.
      reservations_.erase(ref_id);
      remember_expired_locked(ref_id);
      CRESCENT_LOG(kInfo) << "ec producer: reservation " << ref_id << " of " << r.mm_hash
                          << " expired unpulled";
    }
    for (const EcExpiredWrite& w : expired.writes) {
      CRESCENT_LOG(kWarn) << "ec producer: the write of " << w.mm_hash << " never finished";
    }
    if (!expired.empty())
      cv_.notify_all();
    for (auto it = closed_channels_.begin(); it != closed_channels_.end();) {
      if ((*it)->is_finished()) {
        finished.push_back(std::move(*it));
        it = closed_channels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  finished.clear();  // joins, outside the lock
}

Result<EcTensorRef> EcProducer::Impl::publish(const std::string& mm_hash, int64_t num_tokens,
                                              int64_t hidden_size,
                                              const std::function<Status(float* dst)>& write,
                                              Deadline deadline, bool* was_cached) {
  RETURN_IF_ERROR(protocol::validate_id(mm_hash, "publish: mm_hash"));
  if (num_tokens <= 0 || num_tokens > kMaxEcTokensPerImage || hidden_size <= 0 ||
      hidden_size > kMaxEcHiddenSize) {
    return invalid_argument("publish " + mm_hash + ": shape [" + std::to_string(num_tokens) + ", " +
                            std::to_string(hidden_size) + "] is out of range");
  }
  if (options_.compat.hidden_size != 0 && hidden_size != options_.compat.hidden_size) {
    return invalid_argument("publish " + mm_hash + ": hidden_size " + std::to_string(hidden_size) +
                            " differs from the encoder's compat hidden_size " +
                            std::to_string(options_.compat.hidden_size));
  }
  const auto num_bytes = static_cast<uint64_t>(num_tokens * hidden_size) * sizeof(float);
  const TimePoint space_wait_until =
      std::min(deadline.when(), Clock::now() + options_.full_pool_wait);
  bool wrote = false;
  std::unique_lock<std::mutex> lock(mu_);
  ++num_publishes_;
  for (;;) {
    if (is_stopping_)
      return unavailable("encoder " + options_.engine_id + " is shutting down");
    if (auto w = writes_.find(mm_hash); w != writes_.end()) {
      std::shared_ptr<Write> write_state = w->second;
      if (!cv_.wait_until(lock, deadline.when(),
                          [&] { return write_state->is_done || is_stopping_; })) {
        return deadline_exceeded("publish " + mm_hash +
                                 ": deadline passed while another publish was encoding it");
      }
      if (!write_state->status.is_ok()) {
        return write_state->status.with_context("publish " + mm_hash +
                                                ": the concurrent encode of this image failed");
      }
      continue;
    }
    auto a = pool_->allocate(mm_hash, num_bytes, Clock::now());
    if (!a.is_ok()) {
      if (a.status().code() == StatusCode::kResourceExhausted) {
        if (Clock::now() < space_wait_until) {
          cv_.wait_until(lock, space_wait_until);
          continue;
        }
        ++num_refusals_;
        return resource_exhausted(
            "encoder " + options_.engine_id + ": the EC pool (" +
            std::to_string(pool_->capacity_bytes()) + " bytes, --ec-pool-size) cannot hold " +
            mm_hash + " without evicting a reserved or unwritten entry" +
            (options_.full_pool_wait.count() > 0
                 ? " (waited " + std::to_string(options_.full_pool_wait.count()) + " ms)"
                 : std::string()) +
            ": " + a.status().message());
      }
      return a.status().with_context("publish " + mm_hash);
    }
    if (a->must_write) {
      auto write_state = std::make_shared<Write>();
      writes_[mm_hash] = write_state;
      lock.unlock();
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the pool is float storage
      Status s = write(reinterpret_cast<float*>(memory_.data() + a->offset));
      lock.lock();
      writes_.erase(mm_hash);
      if (s.is_ok()) {
        s = pool_->mark_ready(mm_hash, a->entry_id);
      } else {
        ++num_write_failures_;
        (void)pool_->abandon(mm_hash, a->entry_id);
      }
      write_state->is_done = true;
      write_state->status = s;
      cv_.notify_all();
      if (!s.is_ok())
        return s.with_context("publish " + mm_hash + ": encoding into the EC pool");
      wrote = true;
    } else if (a->state == EcEntryState::kAllocated) {
      // Every allocation is written under writes_, so this is a write left over from a writer
      // the pool no longer tracks; wait for the pool to settle it.
      cv_.wait_until(lock, std::min(deadline.when(), Clock::now() + std::chrono::milliseconds(10)));
      if (deadline.is_expired())
        return deadline_exceeded("publish " + mm_hash + ": still being written at the deadline");
      continue;
    }
    // Under mu_ since mark_ready: nothing could evict the entry in between.
    auto r = pool_->reserve(mm_hash, "ec consumer", Clock::now() + options_.reservation_timeout);
    if (!r.is_ok())
      return r.status().with_context("publish " + mm_hash);
    const auto ref_id = static_cast<uint64_t>(r->id.value()) + 1;
    reservations_[ref_id] = Reservation{r->id, mm_hash, r->offset, r->num_bytes, 0};
    if (!wrote)
      ++num_cache_hits_;
    if (was_cached != nullptr)
      *was_cached = !wrote;
    EcTensorRef ref;
    ref.mm_hash = mm_hash;
    ref.engine_id = options_.engine_id;
    ref.worker_addr = worker_addr_;
    ref.bootstrap_addr = options_.bootstrap_addr;
    ref.reservation_id = ref_id;
    ref.shape = {num_tokens, hidden_size};
    ref.dtype = "float32";
    ref.num_bytes = num_bytes;
    ref.expires_at_unix_ms = unix_ms_after(options_.reservation_timeout);
    ref.has_location = true;
    ref.region_id = region_.value();
    ref.offset = r->offset;
    ref.instance = instance_;
    ref.stamp = r->stamp;
    return ref;
  }
}

bool EcProducer::Impl::holds(const std::string& mm_hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto info = pool_->lookup(mm_hash);
  return info.has_value() && info->state != EcEntryState::kAllocated;
}

void EcProducer::Impl::end_reservation_locked(
    std::unordered_map<uint64_t, Reservation>::iterator it) {
  (void)pool_->release(it->second.pool_id);
  if (it->second.channel_id != 0) {
    auto p = peers_.find(it->second.channel_id);
    if (p != peers_.end())
      p->second->pulling.erase(it->first);
  }
  reservations_.erase(it);
  ++num_releases_;
  cv_.notify_all();
}

Status EcProducer::Impl::release(uint64_t reservation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return not_found("encoder " + options_.engine_id + ": no live reservation " +
                     std::to_string(reservation_id) +
                     (expired_ids_.contains(reservation_id) ? " (it expired)" : ""));
  }
  end_reservation_locked(it);
  return Status::ok();
}

void EcProducer::Impl::on_frame(ControlChannel& channel, const net::Frame& frame) {
  std::shared_ptr<Peer> peer;
  bool has_hello = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(channel.id());
    if (it == peers_.end())
      return;
    peer = it->second;
    has_hello = peer->has_hello;
  }
  const auto type = static_cast<MessageType>(frame.type);
  if (type == MessageType::kHello) {
    if (has_hello) {
      channel.abort(failed_precondition("second EC_HELLO on one connection"));
      return;
    }
    handle_hello(*peer, frame.payload);
    return;
  }
  if (!has_hello) {
    channel.abort(
        failed_precondition(ec_protocol::message_type_name(frame.type) + " before EC_HELLO"));
    return;
  }
  switch (type) {
    case MessageType::kAcquire: {
      auto m = ec_protocol::decode_acquire(frame.payload);
      if (!m.is_ok()) {
        channel.abort(m.status());
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        handle_acquire_locked(*peer, *m);
      }
      if (options_.on_acquired)
        options_.on_acquired(m->reservation_id);
      return;
    }
    case MessageType::kRelease: {
      auto m = ec_protocol::decode_release(frame.payload);
      if (!m.is_ok()) {
        channel.abort(m.status());
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      handle_release_locked(*peer, *m);
      return;
    }
    case MessageType::kHeartbeat:
      if (!frame.payload.empty()) {
        channel.abort(data_loss("HEARTBEAT with a payload"));
        return;
      }
      send(channel, MessageType::kHeartbeatAck, "");
      return;
    default:
      channel.abort(data_loss("unexpected " + ec_protocol::message_type_name(frame.type) +
                              " from an EC consumer"));
      return;
  }
}

void EcProducer::Impl::handle_hello(Peer& peer, const std::string& payload) {
  ControlChannel& ch = *peer.channel;
  auto refuse = [&](ec_protocol::RefusalKind kind, const std::string& message) {
    CRESCENT_LOG(kWarn) << "ec producer " << options_.engine_id
                        << ": refused a consumer: " << message;
    send(ch, MessageType::kRefused, ec_protocol::encode(ec_protocol::Refused{kind, message}));
    ch.close(failed_precondition("refused: " + message));
  };
  auto hello = ec_protocol::decode_hello(payload);
  if (!hello.is_ok()) {
    refuse(ec_protocol::RefusalKind::kProtocol, hello.status().message());
    return;
  }
  // Phrased from the consumer's side, which reports it.
  std::string diff = describe_ec_compat_difference(
      hello->compat, "the prefill worker", options_.compat, "encoder " + options_.engine_id);
  if (!diff.empty()) {
    refuse(ec_protocol::RefusalKind::kCompatibility, diff);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer.has_hello = true;
    peer.consumer_name = hello->consumer_name;
  }
  ch.set_heartbeat_interval(std::chrono::milliseconds(hello->heartbeat_interval_ms));
  send(ch, MessageType::kHelloOk,
       ec_protocol::encode(ec_protocol::HelloOk{ec_protocol::kProtocolVersion, options_.engine_id,
                                                engine_->local_segment().serialize()}));
}

void EcProducer::Impl::handle_acquire_locked(Peer& peer, const ec_protocol::Acquire& m) {
  ControlChannel& ch = *peer.channel;
  auto fail = [&](ec_protocol::AcquireFailure reason, const std::string& why) {
    send(ch, MessageType::kAcquireFailed,
         ec_protocol::encode(ec_protocol::AcquireFailed{
             m.reservation_id, reason,
             "encoder " + options_.engine_id + ": reservation " + std::to_string(m.reservation_id) +
                 " of " + m.mm_hash + " " + why}));
  };
  auto it = reservations_.find(m.reservation_id);
  if (it == reservations_.end()) {
    if (expired_ids_.contains(m.reservation_id)) {
      fail(ec_protocol::AcquireFailure::kExpired,
           "expired before it was pulled (reservation timeout " +
               std::to_string(options_.reservation_timeout.count()) + " ms)");
    } else {
      fail(ec_protocol::AcquireFailure::kNotFound, "is not held (unknown or released)");
    }
    return;
  }
  Reservation& r = it->second;
  if (r.mm_hash != m.mm_hash || r.num_bytes != m.num_bytes) {
    fail(ec_protocol::AcquireFailure::kMismatch,
         "does not match: the encoder holds " + r.mm_hash + " of " + std::to_string(r.num_bytes) +
             " bytes, the consumer asked for " + std::to_string(m.num_bytes) + " bytes");
    return;
  }
  if (r.channel_id != 0 && r.channel_id != ch.id()) {
    fail(ec_protocol::AcquireFailure::kBusy, "is being pulled on another connection");
    return;
  }
  if (r.channel_id == 0) {
    CRESCENT_CHECK(pool_->set_reservation_deadline(r.pool_id, TimePoint::max()))
        << "a reservation in the producer's map is not in the pool";
    r.channel_id = ch.id();
    peer.pulling.insert(m.reservation_id);
  }
  ++num_pulls_served_;
  ++num_acquires_served_;
  num_bytes_served_ += r.num_bytes;
  send(ch, MessageType::kAcquired,
       ec_protocol::encode(
           ec_protocol::Acquired{m.reservation_id, region_.value(), r.offset, r.num_bytes}));
}

void EcProducer::Impl::handle_release_locked(Peer& peer, const ec_protocol::Release& m) {
  auto it = reservations_.find(m.reservation_id);
  bool was_held = false;
  // A located release confirms a READ made without EC_ACQUIRE: held only if the reservation
  // is this instance's and its entry lies where the consumer read. Under mu_, the map and the
  // pool agree (expiry erases both), so a reservation found here has been live, its entry
  // unmoved, since publish.
  const bool is_there =
      !m.has_location || (m.instance == instance_ && m.region_id == region_.value() &&
                          it != reservations_.end() && m.offset == it->second.offset);
  if (it != reservations_.end() && it->second.mm_hash == m.mm_hash && is_there) {
    if (m.has_location && it->second.channel_id == 0) {
      ++num_pulls_served_;
      num_bytes_served_ += it->second.num_bytes;
    }
    end_reservation_locked(it);
    was_held = true;
  }
  send(*peer.channel, MessageType::kReleased,
       ec_protocol::encode(ec_protocol::Released{m.reservation_id, was_held}));
}

void EcProducer::Impl::on_closed(ControlChannel& channel, const Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(channel.id());
  if (it == peers_.end())
    return;
  std::shared_ptr<Peer> peer = it->second;
  std::set<uint64_t> pulling;
  pulling.swap(peer->pulling);
  for (uint64_t id : pulling) {
    auto r = reservations_.find(id);
    if (r != reservations_.end())
      end_reservation_locked(r);
  }
  if (!pulling.empty()) {
    CRESCENT_LOG(kInfo) << "ec producer " << options_.engine_id << ": a consumer connection ("
                        << peer->consumer_name << ") closed holding " << pulling.size()
                        << " pulls, released: " << reason.to_string();
  }
  closed_channels_.push_back(peer->channel);
  peers_.erase(it);
}

EcProducerMetrics EcProducer::Impl::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EcTensorPoolStats s = pool_->stats();
  EcProducerMetrics m;
  m.pool_bytes = s.num_bytes_total;
  m.bytes_used = s.num_bytes_used;
  m.bytes_reserved = s.num_bytes_reserved;
  m.num_entries = s.num_entries_allocated + s.num_entries_ready + s.num_entries_reserved;
  m.num_reserved_entries = s.num_entries_reserved;
  m.num_reservations = s.num_reservations;
  for (const auto& [id, r] : reservations_) {
    if (r.channel_id != 0)
      ++m.num_pulling;
  }
  m.num_connections = static_cast<int>(peers_.size());
  m.num_publishes = num_publishes_;
  m.num_cache_hits = num_cache_hits_;
  m.num_evictions = static_cast<uint64_t>(s.num_evictions);
  m.num_expired_reservations = static_cast<uint64_t>(s.num_expired_reservations);
  m.num_pulls_served = num_pulls_served_;
  m.num_acquires_served = num_acquires_served_;
  m.num_bytes_served = num_bytes_served_;
  m.num_releases = num_releases_;
  m.num_refusals = num_refusals_;
  m.num_write_failures = num_write_failures_;
  return m;
}

std::string EcProducer::Impl::render_metrics(const std::string& model_name) const {
  EcProducerMetrics m = metrics();
  const std::string label = "{model_name=\"" + model_name + "\"}";
  const std::string p = "crescent_ec_producer_";
  std::string out;
  prometheus::SampleWriter w(&out, p, label);
  auto gauge = [&](const char* name, const char* help, double v) { w.gauge(name, help, v); };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    w.counter(name, help, static_cast<double>(v));
  };
  gauge("pool_bytes", "Usable bytes of the encoder's EC tensor pool.",
        static_cast<double>(m.pool_bytes));
  gauge("pool_used_bytes", "Pool bytes held by entries (written, being written or reserved).",
        static_cast<double>(m.bytes_used));
  gauge("pool_reserved_bytes", "Pool bytes held by entries with consumer reservations.",
        static_cast<double>(m.bytes_reserved));
  gauge("entries", "Entries in the pool.", m.num_entries);
  gauge("reserved_entries", "Entries held by at least one reservation.", m.num_reserved_entries);
  gauge("reservations", "Live reservations (reserved or being pulled).", m.num_reservations);
  gauge("pulling", "Reservations pinned by a consumer's connection.", m.num_pulling);
  gauge("connections", "Open consumer control connections.", m.num_connections);
  counter("publishes_total", "Tensors published (each one reservation).", m.num_publishes);
  counter("cache_hits_total", "Publishes answered from the pool without encoding.",
          m.num_cache_hits);
  counter("evictions_total", "Unreserved entries evicted to make room.", m.num_evictions);
  counter("expired_reservations_total", "Reservations that expired unpulled.",
          m.num_expired_reservations);
  counter("pulls_total", "Tensors pulled by consumers.", m.num_pulls_served);
  counter("acquires_total",
          "Pulls that took the EC_ACQUIRE round trip (refs without a pool location).",
          m.num_acquires_served);
  counter("pulled_bytes_total", "Bytes pulled by consumers.", m.num_bytes_served);
  counter("releases_total", "Reservations released (by consumers or a closed pull).",
          m.num_releases);
  counter("refusals_total", "Publishes refused because the pool was full of reserved entries.",
          m.num_refusals);
  counter("write_failures_total", "Publishes whose encode (write) failed.", m.num_write_failures);
  return out;
}

EcProducer::EcProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EcProducer::~EcProducer() = default;

Result<std::unique_ptr<EcProducer>> EcProducer::create(EcProducerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<EcProducer>(new EcProducer(std::move(impl)));
}

const std::string& EcProducer::worker_addr() const {
  return impl_->worker_addr();
}
const std::string& EcProducer::engine_id() const {
  return impl_->engine_id();
}
Result<EcTensorRef> EcProducer::publish(const std::string& mm_hash, int64_t num_tokens,
                                        int64_t hidden_size,
                                        const std::function<Status(float* dst)>& write,
                                        Deadline deadline, bool* was_cached) {
  return impl_->publish(mm_hash, num_tokens, hidden_size, write, deadline, was_cached);
}
bool EcProducer::holds(const std::string& mm_hash) const {
  return impl_->holds(mm_hash);
}
Status EcProducer::release(uint64_t reservation_id) {
  return impl_->release(reservation_id);
}
void EcProducer::expire_now() {
  impl_->expire_now();
}
EcProducerMetrics EcProducer::metrics() const {
  return impl_->metrics();
}
std::string EcProducer::render_metrics(const std::string& model_name) const {
  return impl_->render_metrics(model_name);
}

}  // namespace crescent::disagg
