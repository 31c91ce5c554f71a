// The transfer engine: the target-side server (one thread per connection that checks and
// performs or leases every op), and the initiator-side peer links: TcpLink (data frames over
// several connections; the target receives straight into the region) and OneSidedLink (shm
// and ucx: lease -> one-sided copy by the initiator -> acknowledged release).

#include "transfer/transfer_engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/logging.h"
#include "core/thread_pool.h"
#include "net/frame.h"
#include "net/socket.h"
#include "transfer/region_table.h"
#include "transfer/shared_memory.h"
#include "transfer/ucx_context.h"
#include "transfer/wire.h"

namespace crescent::transfer {

namespace {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

Deadline earliest(Deadline a, Deadline b) {
  return a.when() < b.when() ? a : b;
}

Deadline io_deadline(std::chrono::milliseconds io_timeout) {
  return Deadline::after(std::chrono::duration_cast<std::chrono::nanoseconds>(io_timeout));
}

void write_status(ByteWriter& w, const Status& s) {
  w.u16(static_cast<uint16_t>(s.code()));
  w.bytes(s.is_ok() ? std::string_view() : std::string_view(s.message()));
}

Status read_status(ByteReader& r) {
  uint16_t code = r.u16();
  std::string msg = r.bytes(4096);
  if (!r.ok() || code == 0)
    return Status::ok();
  if (code > static_cast<uint16_t>(StatusCode::kInternal)) {
    return data_loss("peer sent an unknown status code " + std::to_string(code));
  }
  return Status(static_cast<StatusCode>(code), "peer: " + msg);
}

// A status in a GROUP_ACK: its text is cut so that a whole group's statuses stay bounded.
void write_group_status(ByteWriter& w, const Status& s) {
  std::string_view msg = s.is_ok() ? std::string_view() : std::string_view(s.message());
  w.u16(static_cast<uint16_t>(s.code()));
  w.bytes(msg.substr(0, wire::kMaxGroupStatusMessageBytes));
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

std::string to_hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0)
    return invalid_argument("odd-length hex string");
  std::string out(hex.size() / 2, '\0');
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return invalid_argument("bad hex digit");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

Result<Fd> connect_address(const std::string& address, Deadline deadline) {
  if (address.rfind("unix:@", 0) == 0) {
    return net::connect_unix_abstract(address.substr(6), deadline);
  }
  if (address.rfind("tcp:", 0) == 0) {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(net::parse_host_port(address.substr(4), &host, &port));
    ASSIGN_OR_RETURN(Fd fd, net::connect_tcp(host, port, deadline));
    net::tune_tcp_stream(fd);
    return fd;
  }
  return invalid_argument("unknown transfer address '" + address + "'");
}

// ---------------------------------------------------------------------------------------------
// Batches and pieces (initiator side)

struct Batch {
  int64_t id = 0;
  int64_t peer = 0;
  Deadline deadline = Deadline::never();
  std::vector<Status> op_status;
  std::vector<uint64_t> op_bytes;
  int64_t num_pending_pieces = 0;
  uint64_t num_bytes = 0;
  bool is_done = false;
  bool is_released = false;
  Status status;
};

// A run of coalesced ops, or a chunk of one (tcp). `ops` are the submitted op indices it covers.
struct Piece {
  std::shared_ptr<Batch> batch;
  std::shared_ptr<const std::vector<uint32_t>> ops;
  OpKind kind = OpKind::kWrite;
  uint8_t* local = nullptr;
  RegionId region;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Completes pieces; implemented by the engine.
class PieceSink {
 public:
  virtual void finish(Piece& piece, const Status& status) = 0;
  virtual void finish_all(std::vector<Piece>& pieces, const Status& status) {
    for (auto& p : pieces) {
      finish(p, status);
    }
    pieces.clear();
  }

 protected:
  ~PieceSink() = default;
};

struct LinkConfig {
  std::string my_name;
  std::string token;
  TransportKind transport = TransportKind::kTcp;
  std::chrono::milliseconds io_timeout{10'000};
};

// Connects and performs the HELLO exchange.
Result<Fd> connect_and_hello(const LinkConfig& cfg, const SegmentDescriptor& peer,
                             uint32_t conn_index, Deadline deadline) {
  ASSIGN_OR_RETURN(Fd fd, connect_address(peer.address, deadline));
  ByteWriter w;
  w.u32(wire::kProtocolVersion);
  w.u8(static_cast<uint8_t>(cfg.transport));
  w.bytes(cfg.my_name);
  w.bytes(cfg.token);
  w.u32(conn_index);
  RETURN_IF_ERROR(net::write_frame(fd, wire::kHello, w.str(), deadline));
  ASSIGN_OR_RETURN(net::Frame reply, net::read_frame(fd, wire::kMaxHelloBytes, deadline));
  ByteReader r(reply.payload);
  if (reply.type == wire::kError) {
    Status s = read_status(r);
    if (s.is_ok())
      return data_loss("peer refused the connection without a reason");
    return s;
  }
  if (reply.type != wire::kHelloOk)
    return data_loss("unexpected reply to HELLO");
  r.bytes(wire::kMaxNameBytes);
  RETURN_IF_ERROR(r.finish("HELLO_OK"));
  return fd;
}

class Link {
 public:
  virtual ~Link() = default;
  virtual void enqueue(std::vector<Piece> pieces) = 0;
  virtual Status notify(std::string_view message, Deadline deadline) = 0;
  // Breaks the link (idempotent; the first reason is what batches report).
  virtual void fail(const Status& why) = 0;
  virtual bool is_broken() const = 0;
  // Breaks the link and joins its threads; every piece has been finished afterwards.
  virtual void shutdown() = 0;
  // The mapping of a region this link was already granted (shm); NotFound when none yet.
  virtual Result<RemoteRegionView> view(RegionId /*region*/) {
    return unimplemented("region views need the shm transport");
  }
};

// Common state for "broken" and its reason.
class BrokenFlag {
 public:
  // Returns true the first time.
  bool set(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (is_broken_)
      return false;
    is_broken_ = true;
    why_ = why;
    return true;
  }
  bool is_set() const {
    std::lock_guard<std::mutex> lock(mu_);
    return is_broken_;
  }
  // The reason to report for a failure `seen` by an I/O thread.
  Status reason(const Status& seen) const {
    std::lock_guard<std::mutex> lock(mu_);
    return is_broken_ ? why_ : seen;
  }

 private:
  mutable std::mutex mu_;
  bool is_broken_ = false;
  Status why_;
};

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// One-sided links (shm, ucx): a Mover copies bytes once the target has leased the regions.

struct Grant {
  RegionId region;
  uint64_t length = 0;
  uint64_t file_offset = 0;
  uint64_t remote_addr = 0;
  std::string rkey;
  bool has_fd = false;
};

class Mover {
 public:
  virtual ~Mover() = default;
  virtual Status add_grant(const Grant& grant, Fd fd) = 0;
  virtual void drop(RegionId region) = 0;
  virtual bool has(RegionId region) const = 0;
  // Copies every piece (each already checked and pinned by the target).
  virtual Status run(std::span<Piece* const> pieces, Deadline deadline) = 0;
  // Thread-safe, unlike the rest (which only the link's worker calls).
  virtual Result<RemoteRegionView> view(RegionId /*region*/) const {
    return unimplemented("region views need the shm transport");
  }
};

class ShmMover final : public Mover {
 public:
  explicit ShmMover(int num_threads)
      : pool_(num_threads > 1 ? std::make_unique<ThreadPool>(num_threads) : nullptr) {}

  Status add_grant(const Grant& g, Fd fd) override {
    if (!fd.is_valid())
      return data_loss("shm grant without a file descriptor");
    uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t aligned = g.file_offset / page * page;
    uint64_t delta = g.file_offset - aligned;
    size_t bytes = g.length + delta;
    // MAP_POPULATE: fill the page tables now, at the grant, instead of one fault per 4 KiB
    // page during the first copies (the first KV transfer into a decode engine).
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(),
                     static_cast<off_t>(aligned));
    if (p == MAP_FAILED)
      return internal_error(std::string("mmap peer region: ") + strerror(errno));
    auto map = std::make_shared<Map>(p, bytes, static_cast<uint8_t*>(p) + delta, g.length);
    std::lock_guard<std::mutex> lock(mu_);
    maps_[g.region.value()] = std::move(map);
    return Status::ok();
  }
  void drop(RegionId region) override {
    std::lock_guard<std::mutex> lock(mu_);
    maps_.erase(region.value());  // unmapped when the last view of it goes
  }
  bool has(RegionId region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return maps_.count(region.value()) != 0;
  }
  Result<RemoteRegionView> view(RegionId region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = maps_.find(region.value());
    if (it == maps_.end())
      return not_found("region " + std::to_string(region.value()) + " is not mapped");
    return RemoteRegionView{it->second->region, it->second->length, it->second};
  }

  Status run(std::span<Piece* const> pieces, Deadline deadline) override {
    struct Copy {
      uint8_t* dst;
      const uint8_t* src;
      uint64_t bytes;
    };
    std::vector<Copy> copies;
    std::vector<std::shared_ptr<const Map>> held;  // a drop() during the copy unmaps nothing
    constexpr uint64_t kChunk = 1 << 20;
    for (Piece* p : pieces) {
      std::shared_ptr<const Map> m;
      {
        std::lock_guard<std::mutex> lock(mu_);
        m = maps_.at(p->region.value());
      }
      CRESCENT_CHECK(p->remote_offset <= m->length && p->length <= m->length - p->remote_offset)
          << "lease granted an op outside the mapping";
      uint8_t* remote = m->region + p->remote_offset;
      bool is_write = p->kind == OpKind::kWrite;
      for (uint64_t off = 0; off < p->length; off += kChunk) {
        uint64_t n = std::min(kChunk, p->length - off);
        copies.push_back(is_write ? Copy{remote + off, p->local + off, n}
                                  : Copy{p->local + off, remote + off, n});
      }
      held.push_back(std::move(m));
    }
    if (pool_ != nullptr && copies.size() > 1) {
      pool_->parallel_range(static_cast<int64_t>(copies.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
        }
      });
    } else {
      for (const Copy& c : copies) {
        std::memcpy(c.dst, c.src, c.bytes);
      }
    }
    if (deadline.is_expired())
      return deadline_exceeded("batch deadline passed during the copy");
    return Status::ok();
  }

 private:
  struct Map {
    Map(void* base, size_t bytes, uint8_t* r, uint64_t len)
        : map_base(base), map_bytes(bytes), region(r), length(len) {}
    ~Map() { ::munmap(map_base, map_bytes); }
    Map(const Map&) = delete;
    Map& operator=(const Map&) = delete;
    void* map_base;
    size_t map_bytes;
    uint8_t* region;
    uint64_t length;
  };
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<const Map>> maps_;  // GUARDED_BY(mu_)
};

class UcxMover final : public Mover {
 public:
  UcxMover(std::unique_ptr<UcxEndpoint> ep, const RegionTable* local_regions)
      : ep_(std::move(ep)), local_regions_(local_regions) {}
  ~UcxMover() override {
    for (auto& [id, r] : rkeys_) {
      ep_->destroy_rkey(r.rkey);
    }
  }
  Status add_grant(const Grant& g, Fd /*fd*/) override {
    ASSIGN_OR_RETURN(void* rkey, ep_->unpack_rkey(g.rkey));
    drop(g.region);
    rkeys_[g.region.value()] = {rkey, g.remote_addr, g.length};
    return Status::ok();
  }
  void drop(RegionId region) override {
    auto it = rkeys_.find(region.value());
    if (it == rkeys_.end())
      return;
    ep_->destroy_rkey(it->second.rkey);
    rkeys_.erase(it);
  }
  bool has(RegionId region) const override { return rkeys_.count(region.value()) != 0; }
  Status run(std::span<Piece* const> pieces, Deadline deadline) override {
    std::vector<UcxOp> ops;
    ops.reserve(pieces.size());
    for (Piece* p : pieces) {
      const Remote& r = rkeys_.at(p->region.value());
      CRESCENT_CHECK(p->remote_offset <= r.length && p->length <= r.length - p->remote_offset)
          << "lease granted an op outside the region";
      ops.push_back({p->kind == OpKind::kWrite, p->local, r.addr + p->remote_offset, p->length,
                     r.rkey, local_regions_->find_ucx_memh(p->local, p->length)});
    }
    return ep_->run(ops, deadline);
  }

 private:
  struct Remote {
    void* rkey;
    uint64_t addr;
    uint64_t length;
  };
  std::unique_ptr<UcxEndpoint> ep_;
  const RegionTable* local_regions_;
  std::unordered_map<int64_t, Remote> rkeys_;
};

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

// ---------------------------------------------------------------------------------------------
// The target side: one thread per accepted connection.

class Server {
 public:
  Server(TransportKind transport, std::string token, RegionTable* regions,
         NotificationCallback on_notification, std::chrono::milliseconds io_timeout,
         std::string name)
      : transport_(transport),
        token_(std::move(token)),
        regions_(regions),
        on_notification_(std::move(on_notification)),
        io_timeout_(io_timeout),
        name_(std::move(name)) {}
  ~Server() { stop(); }

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
    Deadline d = io_deadline(io_timeout_);
    ASSIGN_OR_RETURN(net::Frame f, net::read_frame(fd, wire::kMaxHelloBytes, d));
    if (f.type != wire::kHello)
      return refuse(fd, data_loss("expected HELLO"));
    ByteReader r(f.payload);
    uint32_t version = r.u32();
    auto transport = static_cast<TransportKind>(r.u8());
    *peer_name = r.bytes(wire::kMaxNameBytes);
    std::string token = r.bytes(1024);
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
    if (!constant_time_equal(token, token_)) {
      return refuse(fd, permission_denied("wrong transfer token"));
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
          s = transport_ == TransportKind::kTcp ? serve_piece(fd, *h)
                                                : data_loss("data frame on a one-sided transport");
          break;
        case wire::kWriteGroup:
        case wire::kReadGroup:
          s = transport_ == TransportKind::kTcp ? serve_group(fd, *h)
                                                : data_loss("data frame on a one-sided transport");
          break;
        case wire::kLease:
          s = transport_ != TransportKind::kTcp ? serve_lease(fd, *h, &leases, &described)
                                                : data_loss("LEASE on the tcp transport");
          break;
        case wire::kRelease:
          s = serve_release(fd, *h, &leases);
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

  Status serve_piece(const Fd& fd, const net::FrameHeader& h) {
    if (h.payload_bytes < wire::kPieceHeaderBytes)
      return data_loss("short data frame");
    Deadline d = io_deadline(io_timeout_);
    char fixed[wire::kPieceHeaderBytes];
    RETURN_IF_ERROR(net::read_exact(fd, fixed, sizeof(fixed), d));
    ByteReader r(std::string_view(fixed, sizeof(fixed)));
    uint64_t id = r.u64();
    RegionId region(r.i64());
    uint64_t offset = r.u64();
    uint64_t length = r.u64();
    bool is_write = h.type == wire::kWriteData;
    uint64_t data_bytes = h.payload_bytes - wire::kPieceHeaderBytes;
    if (data_bytes != (is_write ? length : 0))
      return data_loss("data frame length mismatch");
    auto target = regions_->pin(region, offset, length);
    Status op_status = target.status();
    if (is_write) {
      if (target.is_ok()) {
        Status got = net::read_exact(fd, *target, length, d);
        // Pairs with the acquire in serve_notify(): bytes written here happen-before a later
        // notification's callback (what a race checker needs to see the protocol's order).
        data_epoch_.fetch_add(1, std::memory_order_release);
        regions_->unpin(region);
        RETURN_IF_ERROR(got);
      } else {
        RETURN_IF_ERROR(drain(fd, length, d));
      }
    }
    ByteWriter w;
    w.u64(id);
    write_status(w, op_status);
    uint8_t header[net::kFrameHeaderBytes];
    uint64_t send_bytes = (!is_write && target.is_ok()) ? length : 0;
    net::encode_frame_header({static_cast<uint16_t>(is_write ? wire::kAck : wire::kReadResp),
                              w.str().size() + send_bytes},
                             header);
    iovec iov[3] = {{header, sizeof(header)},
                    {w.str().data(), w.str().size()},
                    {send_bytes ? *target : nullptr, send_bytes}};
    Status sent = net::write_all(fd, iov, d);
    if (!is_write && target.is_ok())
      regions_->unpin(region);
    return sent;
  }

  // A WRITE_GROUP / READ_GROUP: the whole op table is read and every op checked and pinned
  // before any payload byte is stored; a refused op's payload goes to a scratch buffer.
  Status serve_group(const Fd& fd, const net::FrameHeader& h) {
    bool is_write = h.type == wire::kWriteGroup;
    if (h.payload_bytes < wire::kGroupHeaderBytes)
      return data_loss("short group frame");
    Deadline d = io_deadline(io_timeout_);
    char fixed[wire::kGroupHeaderBytes];
    RETURN_IF_ERROR(net::read_exact(fd, fixed, sizeof(fixed), d));
    ByteReader fr(std::string_view(fixed, sizeof(fixed)));
    uint64_t id = fr.u64();
    uint32_t n = fr.u32();
    if (n == 0 || n > wire::kMaxOpsPerGroup)
      return data_loss("bad op count in a group frame");
    uint64_t table_bytes = uint64_t{n} * wire::kGroupOpBytes;
    if (h.payload_bytes - wire::kGroupHeaderBytes < table_bytes)
      return data_loss("group frame shorter than its op table");
    std::string table(table_bytes, '\0');
    RETURN_IF_ERROR(net::read_exact(fd, table.data(), table.size(), d));
    uint64_t data_bytes = h.payload_bytes - wire::kGroupHeaderBytes - table_bytes;
    struct GroupOp {
      RegionId region;
      uint64_t length = 0;
      uint8_t* target = nullptr;  // set when the op was checked and pinned
      Status status;
    };
    std::vector<GroupOp> ops(n);
    ByteReader r(table);
    uint64_t total_bytes = 0;
    for (auto& op : ops) {
      op.region = RegionId(r.i64());
      r.u64();
      op.length = r.u64();
      if (op.length > wire::kMaxPieceBytes)
        return data_loss("op longer than a frame in a group frame");
      total_bytes += op.length;  // <= 256 x 4 MiB: cannot overflow
    }
    RETURN_IF_ERROR(r.finish("group op table"));
    if (data_bytes != (is_write ? total_bytes : 0))
      return data_loss("group frame length mismatch");
    if (!is_write && total_bytes > wire::kMaxPieceBytes)
      return data_loss("READ group asks for more than a frame");
    // Every op is checked and pinned before any byte moves.
    ByteReader tr(table);
    uint64_t max_refused_bytes = 0;
    for (auto& op : ops) {
      tr.i64();
      uint64_t offset = tr.u64();
      tr.u64();
      auto pinned = regions_->pin(op.region, offset, op.length);
      if (pinned.is_ok()) {
        op.target = *pinned;
      } else {
        op.status = pinned.status();
        max_refused_bytes = std::max(max_refused_bytes, op.length);
      }
    }
    auto unpin_all = [&] {
      for (auto& op : ops) {
        if (op.status.is_ok())
          regions_->unpin(op.region);
      }
    };
    if (is_write) {
      // Refused payloads all land in one scratch buffer: they are drained, never stored.
      std::vector<char> scratch(max_refused_bytes);
      std::vector<iovec> iov;
      iov.reserve(n);
      for (auto& op : ops) {
        iov.push_back(
            {op.status.is_ok() ? static_cast<void*>(op.target) : static_cast<void*>(scratch.data()),
             op.length});
      }
      Status got = net::read_exact(fd, iov, d);
      // Pairs with the acquire in serve_notify(), as in serve_piece().
      data_epoch_.fetch_add(1, std::memory_order_release);
      unpin_all();
      RETURN_IF_ERROR(got);
    }
    ByteWriter statuses;
    for (auto& op : ops) {
      write_group_status(statuses, op.status);
    }
    ByteWriter w;
    w.u64(id);
    w.u32(n);
    w.u32(static_cast<uint32_t>(statuses.str().size()));
    std::vector<iovec> iov;
    iov.reserve(n + 3);
    uint8_t header[net::kFrameHeaderBytes];
    iov.push_back({header, sizeof(header)});
    iov.push_back({w.str().data(), w.str().size()});
    iov.push_back({statuses.str().data(), statuses.str().size()});
    uint64_t send_bytes = 0;
    if (!is_write) {
      for (auto& op : ops) {
        if (op.status.is_ok()) {
          iov.push_back({op.target, op.length});
          send_bytes += op.length;
        }
      }
    }
    net::encode_frame_header({wire::kGroupAck, w.str().size() + statuses.str().size() + send_bytes},
                             header);
    Status sent = net::write_all(fd, iov, d);
    if (!is_write)
      unpin_all();
    return sent;
  }

  static Status drain(const Fd& fd, uint64_t bytes, Deadline d) {
    char scratch[64 << 10];
    while (bytes > 0) {
      uint64_t n = std::min<uint64_t>(bytes, sizeof(scratch));
      RETURN_IF_ERROR(net::read_exact(fd, scratch, n, d));
      bytes -= n;
    }
    return Status::ok();
  }

  Status serve_lease(const Fd& fd, const net::FrameHeader& h,
                     std::map<uint64_t, std::vector<RegionId>>* leases,
                     std::set<int64_t>* described) {
    if (h.payload_bytes > wire::kMaxControlBytes)
      return resource_exhausted("LEASE too large");
    Deadline d = io_deadline(io_timeout_);
    std::string payload(h.payload_bytes, '\0');
    RETURN_IF_ERROR(net::read_exact(fd, payload.data(), payload.size(), d));
    ByteReader r(payload);
    uint64_t lease_id = r.u64();
    uint32_t n = r.u32();
    if (n > wire::kMaxOpsPerLease)
      return resource_exhausted("too many ops in one LEASE");
    if (leases->count(lease_id) != 0)
      return data_loss("duplicate lease id");
    std::vector<RegionId>& pinned = (*leases)[lease_id];
    ByteWriter w;
    w.u64(lease_id);
    std::vector<RegionId> to_describe;
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      r.u8();
      RegionId region(r.i64());
      uint64_t offset = r.u64();
      uint64_t length = r.u64();
      auto pin = regions_->pin(region, offset, length);
      write_status(w, pin.status());
      if (pin.is_ok()) {
        pinned.push_back(region);
        if (described->insert(region.value()).second)
          to_describe.push_back(region);
      }
    }
    RETURN_IF_ERROR(r.finish("LEASE"));
    std::vector<int> fds;
    w.u32(static_cast<uint32_t>(to_describe.size()));
    for (RegionId id : to_describe) {
      auto region = regions_->describe(id);  // pinned above, so still live
      CRESCENT_CHECK(region.is_ok()) << "pinned region vanished";
      w.i64(id.value());
      w.u64(region->length);
      w.u64(region->file_offset);
      w.u64(reinterpret_cast<uint64_t>(region->addr));
      w.bytes(region->rkey);
      bool has_fd = region->memfd >= 0;
      w.u8(has_fd ? 1 : 0);
      if (has_fd)
        fds.push_back(region->memfd);
    }
    if (fds.size() > 64)
      return resource_exhausted("more than 64 new regions in one lease");
    uint8_t header[net::kFrameHeaderBytes];
    net::encode_frame_header({wire::kLeaseResp, w.str().size()}, header);
    std::string frame(reinterpret_cast<char*>(header), sizeof(header));
    frame += w.str();
    return net::write_with_fds(fd, frame.data(), frame.size(), fds, d);
  }

  Status serve_release(const Fd& fd, const net::FrameHeader& h,
                       std::map<uint64_t, std::vector<RegionId>>* leases) {
    if (h.payload_bytes != 8)
      return data_loss("bad RELEASE");
    Deadline d = io_deadline(io_timeout_);
    char buf[8];
    RETURN_IF_ERROR(net::read_exact(fd, buf, 8, d));
    ByteReader r(std::string_view(buf, 8));
    uint64_t lease_id = r.u64();
    auto it = leases->find(lease_id);
    if (it == leases->end())
      return data_loss("RELEASE of an unknown lease");
    for (RegionId region : it->second) {
      regions_->unpin(region);
    }
    leases->erase(it);
    return net::write_frame(fd, wire::kReleaseOk, std::string_view(buf, 8), d);
  }

  Status serve_notify(const Fd& fd, const net::FrameHeader& h, const std::string& peer) {
    if (h.payload_bytes > kMaxNotificationBytes)
      return resource_exhausted("notification too large");
    std::string msg(h.payload_bytes, '\0');
    RETURN_IF_ERROR(net::read_exact(fd, msg.data(), msg.size(), io_deadline(io_timeout_)));
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
      ASSIGN_OR_RETURN(
          ucx_, UcxContext::create(options_.ucx_tls.empty() ? "tcp,sm,self" : options_.ucx_tls));
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
    server_ =
        std::make_unique<Server>(options_.transport, options_.token, &regions_,
                                 options_.on_notification, options_.io_timeout, options_.name);
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
      d.transport_info_hex = to_hex(ucx_->worker_address());
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
      link = std::make_shared<TcpLink>(static_cast<PieceSink*>(this), std::move(fds),
                                       options_.io_timeout);
    } else {
      ASSIGN_OR_RETURN(Fd fd, connect_and_hello(cfg, peer, 0, deadline));
      std::unique_ptr<Mover> mover;
      if (options_.transport == TransportKind::kShm) {
        mover = std::make_unique<ShmMover>(options_.num_copy_threads);
      } else {
        ASSIGN_OR_RETURN(std::string worker, from_hex(peer.transport_info_hex));
        ASSIGN_OR_RETURN(auto ep, ucx_->connect(worker));
        mover = std::make_unique<UcxMover>(std::move(ep), &regions_);
      }
      link = std::make_shared<OneSidedLink>(static_cast<PieceSink*>(this), std::move(fd),
                                            std::move(mover), options_.io_timeout,
                                            options_.transport == TransportKind::kShm);
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
  std::unique_ptr<Server> server_;

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
