#include "transfer/tcp/tcp_target.h"

#include <sys/uio.h>

#include <algorithm>
#include <string>
#include <vector>

#include "transfer/region_table.h"
#include "transfer/wire.h"

namespace crescent::transfer {

namespace {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

Status drain(const Fd& fd, uint64_t bytes, Deadline d) {
  char scratch[64 << 10];
  while (bytes > 0) {
    uint64_t n = std::min<uint64_t>(bytes, sizeof(scratch));
    RETURN_IF_ERROR(net::read_exact(fd, scratch, n, d));
    bytes -= n;
  }
  return Status::ok();
}

}  // namespace

Status serve_tcp_piece(const TargetContext& ctx, const Fd& fd, const net::FrameHeader& h) {
  if (h.payload_bytes < wire::kPieceHeaderBytes)
    return data_loss("short data frame");
  Deadline d = io_deadline(ctx.io_timeout);
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
  auto target = ctx.regions->pin(region, offset, length);
  Status op_status = target.status();
  if (is_write) {
    if (target.is_ok()) {
      Status got = net::read_exact(fd, *target, length, d);
      // Pairs with the acquire in the server's NOTIFY handling: bytes written here happen-before a
      // later notification's callback (what a race checker needs to see the protocol's order).
      ctx.data_epoch->fetch_add(1, std::memory_order_release);
      ctx.regions->unpin(region);
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
  net::encode_frame_header(
      {static_cast<uint16_t>(is_write ? wire::kAck : wire::kReadResp), w.str().size() + send_bytes},
      header);
  iovec iov[3] = {{header, sizeof(header)},
                  {w.str().data(), w.str().size()},
                  {send_bytes ? *target : nullptr, send_bytes}};
  Status sent = net::write_all(fd, iov, d);
  if (!is_write && target.is_ok())
    ctx.regions->unpin(region);
  return sent;
}

// A WRITE_GROUP / READ_GROUP: the whole op table is read and every op checked and pinned
// before any payload byte is stored; a refused op's payload goes to a scratch buffer.
Status serve_tcp_group(const TargetContext& ctx, const Fd& fd, const net::FrameHeader& h) {
  bool is_write = h.type == wire::kWriteGroup;
  if (h.payload_bytes < wire::kGroupHeaderBytes)
    return data_loss("short group frame");
  Deadline d = io_deadline(ctx.io_timeout);
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
    auto pinned = ctx.regions->pin(op.region, offset, op.length);
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
        ctx.regions->unpin(op.region);
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
    // Pairs with the acquire in the server's NOTIFY handling, as in serve_piece().
    ctx.data_epoch->fetch_add(1, std::memory_order_release);
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

}  // namespace crescent::transfer
