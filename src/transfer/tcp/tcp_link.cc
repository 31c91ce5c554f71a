#include "transfer/tcp/tcp_link.h"

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "net/frame.h"
#include "transfer/protocol.h"
#include "transfer/wire.h"

namespace crescent::transfer {

namespace {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

// TcpLink: each connection has a sender thread (WRITE_DATA with the payload straight from the
// caller's memory, READ_REQ) and a receiver thread (ACK; READ_RESP received straight into the
// caller's memory).

class TcpLink final : public Link {
 public:
  TcpLink(PieceSink* sink, std::vector<Fd> fds, std::chrono::milliseconds io_timeout)
      : sink_(sink), io_timeout_(io_timeout) {
    for (auto& fd : fds) {
      auto c = std::make_unique<Conn>();
      c->fd = std::move(fd);
      conns_.push_back(std::move(c));
    }
    for (auto& c : conns_) {
      Conn* conn = c.get();
      conn->sender = std::thread([this, conn] { send_loop(*conn); });
      conn->receiver = std::thread([this, conn] { receive_loop(*conn); });
    }
  }
  ~TcpLink() override { shutdown(); }

  void enqueue(std::vector<Piece> pieces) override {
    // Queued per connection in one step, so that a sender sees a batch's small ops together
    // and can group them into one frame.
    std::vector<std::vector<Piece>> per_conn(conns_.size());
    uint64_t first = next_conn_.fetch_add(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      per_conn[(first + i) % conns_.size()].push_back(std::move(pieces[i]));
    }
    for (size_t k = 0; k < conns_.size(); ++k) {
      if (per_conn[k].empty())
        continue;
      Conn& c = *conns_[k];
      std::unique_lock<std::mutex> lock(c.mu);
      if (c.is_sender_done) {
        lock.unlock();
        for (auto& p : per_conn[k]) {
          sink_->finish(p, broken_.reason(unavailable("link to peer is closed")));
        }
        continue;
      }
      for (auto& p : per_conn[k]) {
        c.queue.push_back(Item{std::move(p), {}, nullptr});
      }
      c.cv.notify_one();
    }
  }

  Status notify(std::string_view message, Deadline deadline) override {
    // Notifications share connection 0's queue so they stay in order.
    Conn& c = *conns_[0];
    auto done = std::make_shared<NotifyWait>();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.is_sender_done)
        return broken_.reason(unavailable("link to peer is closed"));
      c.queue.push_back(Item{std::nullopt, std::string(message), done});
      c.cv.notify_one();
    }
    std::unique_lock<std::mutex> lock(done->mu);
    if (!done->cv.wait_until(lock, deadline.when(), [&] { return done->is_done; })) {
      return deadline_exceeded("notification not sent before the deadline");
    }
    return done->status;
  }

  void fail(const Status& why) override {
    broken_.set(why);
    for (auto& c : conns_) {
      net::shutdown_both(c->fd);
      std::lock_guard<std::mutex> lock(c->mu);
      c->cv.notify_all();
    }
  }
  bool is_broken() const override { return broken_.is_set(); }

  void shutdown() override {
    fail(cancelled("peer link closed"));
    for (auto& c : conns_) {
      if (c->sender.joinable())
        c->sender.join();
      if (c->receiver.joinable())
        c->receiver.join();
    }
  }

 private:
  struct NotifyWait {
    std::mutex mu;
    std::condition_variable cv;
    bool is_done = false;
    Status status;
    void complete(Status s) {
      std::lock_guard<std::mutex> lock(mu);
      is_done = true;
      status = std::move(s);
      cv.notify_all();
    }
  };
  struct Item {
    std::optional<Piece> piece;
    std::string notification;
    std::shared_ptr<NotifyWait> notify_wait;
  };
  // A piece (or group) on the wire. It is finished by whichever thread comes last: the sender
  // once its sendmsg returned (it no longer reads the memory), the receiver once the peer
  // answered or the connection died. Finishing earlier would let the owner reuse memory that
  // the sender may still be reading.
  struct InFlight {
    std::vector<Piece> pieces;  // one piece, or a group
    bool is_sent = false;
    bool is_answered = false;
    std::vector<Status> statuses;  // one per piece, once answered
  };
  struct Conn {
    Fd fd;
    std::mutex mu;  // queue, is_sender_done
    std::condition_variable cv;
    std::deque<Item> queue;
    bool is_sender_done = false;
    std::mutex pending_mu;  // pending, is_receiver_done
    std::unordered_map<uint64_t, InFlight> pending;
    bool is_receiver_done = false;
    uint64_t next_piece_id = 1;
    std::thread sender;
    std::thread receiver;
  };

  void send_loop(Conn& c) {
    Status failure;
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(c.mu);
        c.cv.wait(lock, [&] { return !c.queue.empty() || broken_.is_set(); });
        if (broken_.is_set())
          break;
        item = std::move(c.queue.front());
        c.queue.pop_front();
      }
      if (!item.piece) {
        Status s =
            net::write_frame(c.fd, wire::kNotify, item.notification, io_deadline(io_timeout_));
        item.notify_wait->complete(s);
        if (!s.is_ok()) {
          failure = s;
          break;
        }
        continue;
      }
      if (is_groupable(*item.piece)) {
        std::vector<Piece> group;
        uint64_t frame_bytes = wire::kGroupHeaderBytes + wire::kGroupOpBytes + item.piece->length;
        group.push_back(std::move(*item.piece));
        {
          std::lock_guard<std::mutex> lock(c.mu);
          while (!c.queue.empty() && group.size() < wire::kMaxOpsPerGroup) {
            const Item& next = c.queue.front();
            if (!next.piece || next.piece->kind != group[0].kind || !is_groupable(*next.piece))
              break;
            uint64_t more = wire::kGroupOpBytes + next.piece->length;
            if (frame_bytes + more > wire::kPieceHeaderBytes + wire::kMaxPieceBytes)
              break;
            frame_bytes += more;
            group.push_back(std::move(*c.queue.front().piece));
            c.queue.pop_front();
          }
        }
        if (group.size() > 1) {
          failure = send_group(c, std::move(group));
          if (!failure.is_ok())
            break;
          continue;
        }
        item.piece = std::move(group[0]);
      }
      Piece& p = *item.piece;
      uint64_t id = c.next_piece_id++;
      ByteWriter w;
      w.u64(id);
      w.i64(p.region.value());
      w.u64(p.remote_offset);
      w.u64(p.length);
      bool is_write = p.kind == OpKind::kWrite;
      uint8_t header[net::kFrameHeaderBytes];
      net::encode_frame_header({static_cast<uint16_t>(is_write ? wire::kWriteData : wire::kReadReq),
                                wire::kPieceHeaderBytes + (is_write ? p.length : 0)},
                               header);
      uint8_t* local = p.local;
      uint64_t length = p.length;
      {
        std::lock_guard<std::mutex> lock(c.pending_mu);
        if (c.is_receiver_done) {
          sink_->finish(p, broken_.reason(unavailable("connection to peer closed")));
          failure = unavailable("connection to peer closed");
          break;
        }
        InFlight one;
        one.pieces.push_back(std::move(p));
        c.pending.emplace(id, std::move(one));
      }
      iovec iov[3] = {{header, sizeof(header)},
                      {w.str().data(), w.str().size()},
                      {local, is_write ? length : 0}};
      Status s = net::write_all(c.fd, iov, io_deadline(io_timeout_));
      mark_sent(c, id);
      if (!s.is_ok()) {
        failure = s;
        break;
      }
    }
    if (!failure.is_ok())
      fail(failure);
    std::deque<Item> left;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.is_sender_done = true;
      left.swap(c.queue);
    }
    Status why = broken_.reason(failure.is_ok() ? cancelled("link closed") : failure);
    for (auto& item : left) {
      if (item.piece) {
        sink_->finish(*item.piece, why);
      } else {
        item.notify_wait->complete(why);
      }
    }
  }

  void receive_loop(Conn& c) {
    Status failure;
    for (;;) {
      auto header = net::read_frame_header(
          c.fd, wire::kMaxPieceBytes + wire::kMaxGroupStatusBytes + 4096, Deadline::never());
      if (!header.is_ok()) {
        failure = header.status();
        break;
      }
      failure = handle_reply(c, *header);
      if (!failure.is_ok())
        break;
    }
    fail(failure);
    std::vector<Piece> left;
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      c.is_receiver_done = true;
      // What the sender is still writing stays: mark_sent() finishes it.
      for (auto it = c.pending.begin(); it != c.pending.end();) {
        if (!it->second.is_sent) {
          ++it;
          continue;
        }
        for (auto& p : it->second.pieces) {
          left.push_back(std::move(p));
        }
        it = c.pending.erase(it);
      }
    }
    Status why = broken_.reason(failure);
    for (auto& p : left) {
      sink_->finish(p, why);
    }
  }

  // The sender's write of `id` returned. Finishes it if the peer already answered or can no
  // longer answer.
  void mark_sent(Conn& c, uint64_t id) {
    InFlight done;
    bool is_receiver_done = false;
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      auto it = c.pending.find(id);
      CRESCENT_CHECK(it != c.pending.end());
      it->second.is_sent = true;
      if (!it->second.is_answered && !c.is_receiver_done)
        return;
      is_receiver_done = !it->second.is_answered;
      done = std::move(it->second);
      c.pending.erase(it);
    }
    Status why;
    if (is_receiver_done)
      why = broken_.reason(unavailable("connection to peer closed"));
    for (size_t i = 0; i < done.pieces.size(); ++i) {
      sink_->finish(done.pieces[i], is_receiver_done ? why : done.statuses[i]);
    }
  }

  // The peer answered `id`. Finishes it unless the sender is still writing it.
  void mark_answered(Conn& c, uint64_t id, std::vector<Status> statuses) {
    InFlight done;
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      auto it = c.pending.find(id);
      CRESCENT_CHECK(it != c.pending.end());
      if (!it->second.is_sent) {
        it->second.is_answered = true;
        it->second.statuses = std::move(statuses);
        return;
      }
      done = std::move(it->second);
      c.pending.erase(it);
    }
    for (size_t i = 0; i < done.pieces.size(); ++i) {
      sink_->finish(done.pieces[i], statuses[i]);
    }
  }

  Status handle_reply(Conn& c, const net::FrameHeader& h) {
    if (h.type == wire::kGroupAck)
      return handle_group_ack(c, h);
    if (h.type != wire::kAck && h.type != wire::kReadResp) {
      return data_loss("unexpected frame type " + std::to_string(h.type) + " from peer");
    }
    // Fixed part: piece id (8), code (2), message length (4) + message.
    uint8_t fixed[14];
    if (h.payload_bytes < sizeof(fixed))
      return data_loss("short reply from peer");
    Deadline d = io_deadline(io_timeout_);
    RETURN_IF_ERROR(net::read_exact(c.fd, fixed, sizeof(fixed), d));
    ByteReader fr(std::string_view(reinterpret_cast<char*>(fixed), sizeof(fixed)));
    uint64_t id = fr.u64();
    uint16_t code = fr.u16();
    uint32_t msg_len = fr.u32();
    if (msg_len > 4096 || msg_len > h.payload_bytes - sizeof(fixed)) {
      return data_loss("bad reply message length");
    }
    std::string msg(msg_len, '\0');
    RETURN_IF_ERROR(net::read_exact(c.fd, msg.data(), msg.size(), d));
    uint64_t data_bytes = h.payload_bytes - sizeof(fixed) - msg_len;
    Piece p;
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      auto it = c.pending.find(id);
      if (it == c.pending.end() || it->second.pieces.size() != 1 || it->second.is_answered)
        return data_loss("reply for an unknown piece from peer");
      // Stays in `pending` while bytes land in its memory, so a failure mid-read finishes it.
      p = it->second.pieces[0];
    }
    Status op_status;
    if (code != 0) {
      ByteWriter w;
      w.u16(code);
      w.bytes(msg);
      ByteReader r(w.str());
      op_status = read_status(r);
      if (data_bytes != 0)
        return data_loss("refused op carries data");
    } else if (h.type == wire::kReadResp) {
      if (data_bytes != p.length)
        return data_loss("READ reply of the wrong length");
      RETURN_IF_ERROR(net::read_exact(c.fd, p.local, p.length, d));
    } else if (data_bytes != 0) {
      return data_loss("ACK carries data");
    }
    std::vector<Status> statuses;
    statuses.push_back(std::move(op_status));
    mark_answered(c, id, std::move(statuses));
    return Status::ok();
  }

  static bool is_groupable(const Piece& p) { return p.length <= wire::kMaxGroupedOpBytes; }

  // One WRITE_GROUP / READ_GROUP frame for many small pieces of one kind: a header, the op
  // table and (WRITE) the payloads straight from the caller's memory, in one sendmsg.
  Status send_group(Conn& c, std::vector<Piece> group) {
    bool is_write = group[0].kind == OpKind::kWrite;
    uint64_t id = c.next_piece_id++;
    ByteWriter w;
    w.u64(id);
    w.u32(static_cast<uint32_t>(group.size()));
    uint64_t data_bytes = 0;
    std::vector<iovec> iov;
    iov.reserve(group.size() + 2);
    iov.push_back({nullptr, net::kFrameHeaderBytes});
    iov.push_back({nullptr, 0});
    for (const Piece& p : group) {
      w.i64(p.region.value());
      w.u64(p.remote_offset);
      w.u64(p.length);
      if (is_write) {
        data_bytes += p.length;
        iov.push_back({p.local, p.length});
      }
    }
    uint8_t header[net::kFrameHeaderBytes];
    net::encode_frame_header(
        {static_cast<uint16_t>(is_write ? wire::kWriteGroup : wire::kReadGroup),
         w.str().size() + data_bytes},
        header);
    iov[0].iov_base = header;
    iov[1] = {w.str().data(), w.str().size()};
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      if (c.is_receiver_done) {
        Status why = broken_.reason(unavailable("connection to peer closed"));
        for (auto& p : group) {
          sink_->finish(p, why);
        }
        return unavailable("connection to peer closed");
      }
      InFlight entry;
      entry.pieces = std::move(group);
      c.pending.emplace(id, std::move(entry));
    }
    Status s = net::write_all(c.fd, iov, io_deadline(io_timeout_));
    mark_sent(c, id);
    return s;
  }

  Status handle_group_ack(Conn& c, const net::FrameHeader& h) {
    uint8_t fixed[16];  // group id, op count, status bytes
    if (h.payload_bytes < sizeof(fixed))
      return data_loss("short group reply from peer");
    Deadline d = io_deadline(io_timeout_);
    RETURN_IF_ERROR(net::read_exact(c.fd, fixed, sizeof(fixed), d));
    ByteReader fr(std::string_view(reinterpret_cast<char*>(fixed), sizeof(fixed)));
    uint64_t id = fr.u64();
    uint32_t n = fr.u32();
    uint32_t status_bytes = fr.u32();
    if (status_bytes > wire::kMaxGroupStatusBytes || status_bytes > h.payload_bytes - sizeof(fixed))
      return data_loss("bad group reply status length");
    std::string statuses(status_bytes, '\0');
    RETURN_IF_ERROR(net::read_exact(c.fd, statuses.data(), statuses.size(), d));
    uint64_t data_bytes = h.payload_bytes - sizeof(fixed) - status_bytes;
    std::vector<Piece> group;
    {
      std::lock_guard<std::mutex> lock(c.pending_mu);
      auto it = c.pending.find(id);
      if (it == c.pending.end() || it->second.pieces.size() != n || it->second.is_answered)
        return data_loss("reply for an unknown group from peer");
      // Stays in `pending` while bytes land in its memory, so a failure mid-read finishes it.
      group = it->second.pieces;
    }
    ByteReader r(statuses);
    std::vector<Status> op_status;
    op_status.reserve(n);
    std::vector<iovec> iov;
    uint64_t expected_bytes = 0;
    for (uint32_t i = 0; i < n; ++i) {
      op_status.push_back(read_status(r));
      if (op_status.back().is_ok() && group[i].kind == OpKind::kRead) {
        iov.push_back({group[i].local, group[i].length});
        expected_bytes += group[i].length;
      }
    }
    RETURN_IF_ERROR(r.finish("GROUP_ACK"));
    if (data_bytes != expected_bytes)
      return data_loss("group reply of the wrong length");
    RETURN_IF_ERROR(net::read_exact(c.fd, iov, d));
    mark_answered(c, id, std::move(op_status));
    return Status::ok();
  }

  PieceSink* sink_;
  std::chrono::milliseconds io_timeout_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint64_t> next_conn_{0};
  BrokenFlag broken_;
};

}  // namespace

std::shared_ptr<Link> make_tcp_link(PieceSink* sink, std::vector<net::Fd> fds,
                                    std::chrono::milliseconds io_timeout) {
  return std::make_shared<TcpLink>(sink, std::move(fds), io_timeout);
}

}  // namespace crescent::transfer
