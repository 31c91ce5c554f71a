#include "transfer/server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "net/auth/handshake.h"
#include "net/frame.h"
#include "transfer/lease_target.h"
#include "transfer/protocol.h"
#include "transfer/region_table.h"
#include "transfer/tcp/tcp_target.h"
#include "transfer/wire.h"

namespace crescent::transfer {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

class TransferServer::Impl {
 public:
  Impl(TransportKind transport, std::string token, RegionTable* regions,
       NotificationCallback on_notification, std::chrono::milliseconds io_timeout, std::string name)
      : transport_(transport),
        token_(std::move(token)),
        regions_(regions),
        on_notification_(std::move(on_notification)),
        io_timeout_(io_timeout),
        name_(std::move(name)) {}
  ~Impl() { stop(); }

  void start(Fd listener) {
    listener_ = std::move(listener);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  void stop() {
    if (is_stopping_.exchange(true))
      return;
    uint64_t one = 1;
    (void)::write(wake_fd_.get(), &one, sizeof(one));
    if (accept_thread_.joinable())
      accept_thread_.join();
    std::list<Conn> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) {
      net::shutdown_both(*c.fd);
    }
    for (auto& c : conns) {
      if (c.thread.joinable())
        c.thread.join();
    }
  }

 private:
  TargetContext target_context() { return {regions_, io_timeout_, &data_epoch_}; }

  struct Conn {
    std::shared_ptr<Fd> fd;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> is_done;
  };

  void accept_loop() {
    while (!is_stopping_.load()) {
      auto fd = net::accept_with_deadline(listener_, Deadline::never(), wake_fd_.get());
      if (!fd.is_ok()) {
        if (!is_stopping_.load()) {
          CRESCENT_LOG(kWarn) << "transfer: accept failed: " << fd.status().to_string();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      if (transport_ != TransportKind::kShm)
        net::tune_tcp_stream(*fd);
      std::lock_guard<std::mutex> lock(mu_);
      reap_locked();
      if (is_stopping_.load())
        break;
      Conn c;
      c.fd = std::make_shared<Fd>(std::move(*fd));
      c.is_done = std::make_shared<std::atomic<bool>>(false);
      c.thread = std::thread([this, f = c.fd, done = c.is_done] {
        serve(*f);
        done->store(true);
      });
      conns_.push_back(std::move(c));
    }
  }

  void reap_locked() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->is_done->load()) {
        it->thread.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  Status refuse(const Fd& fd, const Status& why) {
    ByteWriter w;
    write_status(w, why);
    (void)net::write_frame(fd, wire::kError, w.str(), Deadline::after_ms(1000));
    return why;
  }

  Status hello(const Fd& fd, std::string* peer_name) {
    RETURN_IF_ERROR(net::auth::authenticate_client(fd, token_));
    Deadline d = io_deadline(io_timeout_);
    ASSIGN_OR_RETURN(net::Frame f, net::read_frame(fd, wire::kMaxHelloBytes, d));
    if (f.type != wire::kHello)
      return refuse(fd, data_loss("expected HELLO"));
    ByteReader r(f.payload);
    uint32_t version = r.u32();
    auto transport = static_cast<TransportKind>(r.u8());
    *peer_name = r.bytes(wire::kMaxNameBytes);
    r.bytes(1024);  // the retired clear-text token field, empty
    r.u32();
    RETURN_IF_ERROR(r.finish("HELLO"));
    if (version != wire::kProtocolVersion) {
      return refuse(fd, failed_precondition("protocol version " + std::to_string(version) +
                                            " is not " + std::to_string(wire::kProtocolVersion)));
    }
    if (transport != transport_) {
      return refuse(fd, failed_precondition("peer uses another transport than " +
                                            std::string(transport_name(transport_))));
    }
    ByteWriter w;
    w.bytes(name_);
    return net::write_frame(fd, wire::kHelloOk, w.str(), d);
  }

  void serve(const Fd& fd) {
    std::string peer;
    Status s = hello(fd, &peer);
    std::map<uint64_t, std::vector<RegionId>> leases;
    std::set<int64_t> described;
    while (s.is_ok()) {
      auto h = net::read_frame_header(fd, wire::kPieceHeaderBytes + wire::kMaxPieceBytes,
                                      Deadline::never());
      if (!h.is_ok()) {
        s = h.status();
        break;
      }
      switch (h->type) {
        case wire::kWriteData:
        case wire::kReadReq:
          s = transport_ == TransportKind::kTcp ? serve_tcp_piece(target_context(), fd, *h)
                                                : data_loss("data frame on a one-sided transport");
          break;
        case wire::kWriteGroup:
        case wire::kReadGroup:
          s = transport_ == TransportKind::kTcp ? serve_tcp_group(target_context(), fd, *h)
                                                : data_loss("data frame on a one-sided transport");
          break;
        case wire::kLease:
          s = transport_ != TransportKind::kTcp
                  ? serve_lease(target_context(), fd, *h, &leases, &described)
                  : data_loss("LEASE on the tcp transport");
          break;
        case wire::kRelease:
          s = serve_release(target_context(), fd, *h, &leases);
          break;
        case wire::kNotify:
          s = serve_notify(fd, *h, peer);
          break;
        default:
          s = data_loss("unknown frame type " + std::to_string(h->type));
      }
    }
    for (auto& [id, regions] : leases) {
      for (RegionId r : regions) {
        regions_->unpin(r);
      }
    }
    // Closes now rather than when the thread is reaped, so the peer sees the refusal at once.
    net::shutdown_both(fd);
    if (s.code() != StatusCode::kUnavailable && !is_stopping_.load()) {
      CRESCENT_LOG(kWarn) << "transfer: dropped connection from '" << peer
                          << "': " << s.to_string();
    }
  }

  Status serve_notify(const Fd& fd, const net::FrameHeader& h, const std::string& peer) {
    if (h.payload_bytes > kMaxNotificationBytes)
      return resource_exhausted("notification too large");
    std::string msg(h.payload_bytes, '\0');
    RETURN_IF_ERROR(net::read_exact(fd, msg.data(), msg.size(), io_deadline(io_timeout_)));
    // Pairs with the release in the data handlers (TargetContext::data_epoch).
    data_epoch_.load(std::memory_order_acquire);
    if (on_notification_)
      on_notification_(peer, std::move(msg));
    return Status::ok();
  }

  TransportKind transport_;
  std::string token_;
  RegionTable* regions_;
  NotificationCallback on_notification_;
  std::chrono::milliseconds io_timeout_;
  std::string name_;
  Fd listener_;
  Fd wake_fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::thread accept_thread_;
  std::atomic<bool> is_stopping_{false};
  std::atomic<uint64_t> data_epoch_{0};
  std::mutex mu_;
  std::list<Conn> conns_;
};

TransferServer::TransferServer(TransportKind transport, std::string token, RegionTable* regions,
                               NotificationCallback on_notification,
                               std::chrono::milliseconds io_timeout, std::string name)
    : impl_(std::make_unique<Impl>(transport, std::move(token), regions, std::move(on_notification),
                                   io_timeout, std::move(name))) {}

TransferServer::~TransferServer() = default;

void TransferServer::start(net::Fd listener) {
  impl_->start(std::move(listener));
}

void TransferServer::stop() {
  impl_->stop();
}

}  // namespace crescent::transfer
