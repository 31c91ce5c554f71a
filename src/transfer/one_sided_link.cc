#include "transfer/one_sided_link.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "net/frame.h"
#include "transfer/protocol.h"
#include "transfer/wire.h"

namespace crescent::transfer {

namespace {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

class OneSidedLink final : public Link {
 public:
  OneSidedLink(PieceSink* sink, Fd fd, std::unique_ptr<Mover> mover,
               std::chrono::milliseconds io_timeout, bool receives_fds)
      : sink_(sink),
        fd_(std::move(fd)),
        mover_(std::move(mover)),
        io_timeout_(io_timeout),
        receives_fds_(receives_fds) {
    worker_ = std::thread([this] { work_loop(); });
  }
  ~OneSidedLink() override { shutdown(); }

  void enqueue(std::vector<Piece> pieces) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (is_worker_done_) {
      lock.unlock();
      sink_->finish_all(pieces, broken_.reason(unavailable("link to peer is closed")));
      return;
    }
    queue_.push_back(std::move(pieces));
    cv_.notify_one();
  }

  Status notify(std::string_view message, Deadline deadline) override {
    if (broken_.is_set())
      return broken_.reason(unavailable("link to peer is closed"));
    std::lock_guard<std::mutex> lock(write_mu_);
    Status s =
        net::write_frame(fd_, wire::kNotify, message, earliest(deadline, io_deadline(io_timeout_)));
    if (!s.is_ok())
      fail(s);
    return s;
  }

  void fail(const Status& why) override {
    broken_.set(why);
    net::shutdown_both(fd_);
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  bool is_broken() const override { return broken_.is_set(); }
  void shutdown() override {
    fail(cancelled("peer link closed"));
    if (worker_.joinable())
      worker_.join();
  }
  Result<RemoteRegionView> view(RegionId region) override { return mover_->view(region); }

 private:
  void work_loop() {
    Status failure;
    for (;;) {
      std::vector<Piece> pieces;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || broken_.is_set(); });
        if (broken_.is_set())
          break;
        pieces = std::move(queue_.front());
        queue_.pop_front();
      }
      size_t begin = 0;
      while (begin < pieces.size()) {
        size_t end = std::min<size_t>(pieces.size(), begin + wire::kMaxOpsPerLease);
        failure = run_lease(std::span<Piece>(pieces.data() + begin, end - begin));
        if (!failure.is_ok())
          break;
        begin = end;
      }
      if (!failure.is_ok()) {
        fail(failure);
        Status why = broken_.reason(failure);
        for (size_t i = begin; i < pieces.size(); ++i) {
          sink_->finish(pieces[i], why);
        }
        break;
      }
    }
    std::deque<std::vector<Piece>> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      is_worker_done_ = true;
      left.swap(queue_);
    }
    Status why = broken_.reason(failure.is_ok() ? cancelled("link closed") : failure);
    for (auto& pieces : left) {
      sink_->finish_all(pieces, why);
    }
  }

  // Leases the pieces' ranges, copies, releases. Finishes every piece that it returns OK for;
  // a non-OK return means the link is broken and the remaining pieces are the caller's.
  Status run_lease(std::span<Piece> pieces) {
    uint64_t lease_id = next_lease_id_++;
    Deadline deadline = pieces.front().batch->deadline;
    Deadline d = earliest(deadline, io_deadline(io_timeout_));
    ByteWriter w;
    w.u64(lease_id);
    w.u32(static_cast<uint32_t>(pieces.size()));
    for (const Piece& p : pieces) {
      w.u8(static_cast<uint8_t>(p.kind));
      w.i64(p.region.value());
      w.u64(p.remote_offset);
      w.u64(p.length);
    }
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      RETURN_IF_ERROR(net::write_frame(fd_, wire::kLease, w.str(), d));
    }
    std::vector<Fd> fds;
    ASSIGN_OR_RETURN(net::Frame reply, net::read_frame(fd_, wire::kMaxControlBytes, d,
                                                       receives_fds_ ? &fds : nullptr));
    if (reply.type != wire::kLeaseResp)
      return data_loss("unexpected reply to LEASE");
    ByteReader r(reply.payload);
    if (r.u64() != lease_id)
      return data_loss("LEASE reply for another lease");
    std::vector<Status> op_status(pieces.size());
    for (auto& s : op_status) {
      s = read_status(r);
    }
    uint32_t num_grants = r.u32();
    size_t next_fd = 0;
    for (uint32_t i = 0; i < num_grants && r.ok(); ++i) {
      Grant g;
      g.region = RegionId(r.i64());
      g.length = r.u64();
      g.file_offset = r.u64();
      g.remote_addr = r.u64();
      g.rkey = r.bytes(1 << 16);
      g.has_fd = r.u8() != 0;
      if (!r.ok())
        break;
      Fd fd;
      if (g.has_fd) {
        if (next_fd >= fds.size())
          return data_loss("LEASE reply lacks a file descriptor");
        fd = std::move(fds[next_fd++]);
      }
      RETURN_IF_ERROR(mover_->add_grant(g, std::move(fd)));
    }
    RETURN_IF_ERROR(r.finish("LEASE_RESP"));
    std::vector<Piece*> to_copy;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (op_status[i].is_ok() && !mover_->has(pieces[i].region)) {
        op_status[i] = data_loss("peer leased a region it never described");
      }
      if (op_status[i].code() == StatusCode::kNotFound)
        mover_->drop(pieces[i].region);
      if (op_status[i].is_ok())
        to_copy.push_back(&pieces[i]);
    }
    Status copied = to_copy.empty() ? Status::ok() : mover_->run(to_copy, deadline);
    {
      ByteWriter rw;
      rw.u64(lease_id);
      std::lock_guard<std::mutex> lock(write_mu_);
      RETURN_IF_ERROR(net::write_frame(fd_, wire::kRelease, rw.str(), d));
    }
    // The acknowledgement says that the target is alive and has unpinned: only then did the
    // bytes reach memory that the target still owns.
    ASSIGN_OR_RETURN(net::Frame ack,
                     net::read_frame(fd_, 64, earliest(deadline, io_deadline(io_timeout_))));
    ByteReader ar(ack.payload);
    if (ack.type != wire::kReleaseOk || ar.u64() != lease_id) {
      return data_loss("unexpected reply to RELEASE");
    }
    if (!copied.is_ok())
      return copied;
    for (size_t i = 0; i < pieces.size(); ++i) {
      sink_->finish(pieces[i], op_status[i]);
    }
    return Status::ok();
  }

  PieceSink* sink_;
  Fd fd_;
  std::unique_ptr<Mover> mover_;  // worker thread only, but for view()
  std::chrono::milliseconds io_timeout_;
  bool receives_fds_;
  uint64_t next_lease_id_ = 1;
  std::mutex write_mu_;  // whole frames on fd_
  std::mutex mu_;        // queue_, is_worker_done_
  std::condition_variable cv_;
  std::deque<std::vector<Piece>> queue_;
  bool is_worker_done_ = false;
  BrokenFlag broken_;
  std::thread worker_;
};

}  // namespace

std::shared_ptr<Link> make_one_sided_link(PieceSink* sink, net::Fd fd, std::unique_ptr<Mover> mover,
                                          std::chrono::milliseconds io_timeout, bool receives_fds) {
  return std::make_shared<OneSidedLink>(sink, std::move(fd), std::move(mover), io_timeout,
                                        receives_fds);
}

}  // namespace crescent::transfer
