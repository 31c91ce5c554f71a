// Fuzz target: the decoders of what peers send on the control planes. Byte 0 selects the
// decoder, the rest is the payload (or, for the transfer target, the bytes on the connection):
//    0..5   disagg KV control channel (src/disagg/protocol): HELLO, HELLO_OK, REFUSED, ASK,
//           NOT_NEEDED/CANCEL/CANCEL_ACK, DONE
//    6..12  EC protocol (src/disagg/ec_protocol): HELLO, HELLO_OK, REFUSED, ACQUIRE, ACQUIRED,
//           ACQUIRE_FAILED, RELEASE, RELEASED
//   13      ec_transfer_params JSON (an encoder's answer, relayed by clients)
//   14..18  bootstrap wire (src/bootstrap/wire): registration, query, registered, encoders,
//           error bodies
//   19      transfer: the 16-byte frame header, a status, a segment descriptor, hex
//   20      transfer target side (src/transfer/tcp, lease_target): a stream of frames
//           (WRITE_DATA, READ_REQ, WRITE_GROUP, READ_GROUP, LEASE, RELEASE) served over a
//           socket pair against two small registered regions
// Invariants: every decoder returns a value or an error Status with a message, never crashes,
// throws or reads out of bounds; a payload a decoder accepts re-encodes to one it accepts
// again; the transfer target never stores a byte outside a region and leaves no pin behind.

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/wire.h"
#include "core/check.h"
#include "core/json.h"
#include "disagg/ec_protocol.h"
#include "disagg/protocol.h"
#include "net/auth/auth_token.h"
#include "net/frame.h"
#include "net/socket.h"
#include "transfer/lease_target.h"
#include "transfer/protocol.h"
#include "transfer/region_table.h"
#include "transfer/tcp/tcp_target.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace {

namespace kv = crescent::disagg::protocol;
namespace ec = crescent::disagg::ec_protocol;
namespace bs = crescent::bootstrap;
namespace tr = crescent::transfer;
using crescent::Status;

// A decoded message re-encodes to a payload that decodes again.
template <typename Decode, typename Encode>
void round_trip(std::string_view payload, Decode decode, Encode encode) {
  auto first = decode(payload);
  if (!first.is_ok()) {
    CRESCENT_CHECK(!first.status().message().empty());
    return;
  }
  std::string again = encode(*first);
  auto second = decode(again);
  CRESCENT_CHECK(second.is_ok()) << "re-encoded payload refused: " << second.status().to_string();
}

void fuzz_bootstrap(int which, std::string_view body) {
  switch (which) {
    case 0: {
      auto r = bs::parse_registration_json(body);
      if (r.is_ok()) {
        auto again = bs::parse_registration_json(bs::registration_json(*r));
        CRESCENT_CHECK(again.is_ok()) << again.status().to_string();
      }
      break;
    }
    case 1: {
      auto r = bs::parse_query_json(body);
      if (r.is_ok()) {
        auto again = bs::parse_query_json(bs::query_json(*r));
        CRESCENT_CHECK(again.is_ok()) << again.status().to_string();
      }
      break;
    }
    case 2:
      (void)bs::registered_json(bs::parse_registered_json(body));
      break;
    case 3: {
      auto r = bs::parse_encoders_json(body);
      if (r.is_ok()) {
        auto again = bs::parse_encoders_json(bs::encoders_json(*r));
        CRESCENT_CHECK(again.is_ok()) << again.status().to_string();
      }
      break;
    }
    default:
      (void)bs::parse_error_json(body);
      break;
  }
}

void fuzz_ec_transfer_params(std::string_view text) {
  auto j = crescent::parse_json(text, "ec_transfer_params");
  if (!j.is_ok()) {
    return;
  }
  auto refs = crescent::disagg::parse_ec_transfer_params(*j);
  if (refs.is_ok()) {
    auto again = crescent::disagg::parse_ec_transfer_params(
        crescent::disagg::ec_transfer_params_to_json(*refs));
    CRESCENT_CHECK(again.is_ok()) << again.status().to_string();
  }
}

void fuzz_transfer_pieces(std::string_view payload) {
  if (payload.size() >= crescent::net::kFrameHeaderBytes) {
    (void)crescent::net::decode_frame_header(reinterpret_cast<const uint8_t*>(payload.data()),
                                             1 << 20);
  }
  crescent::net::ByteReader r(payload);
  Status s = tr::read_status(r);
  (void)s.message();
  auto d = tr::SegmentDescriptor::parse(payload);
  if (d.is_ok()) {
    auto again = tr::SegmentDescriptor::parse(d->serialize());
    CRESCENT_CHECK(again.is_ok()) << again.status().to_string();
  }
  auto bytes = tr::from_hex(payload);
  if (bytes.is_ok()) {
    CRESCENT_CHECK(crescent::net::auth::to_hex(*bytes).size() == payload.size());
  }
}

// Non-blocking read of whatever the target side answered, so its writes never block.
void drain(int fd) {
  char buf[64 << 10];
  while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

void fuzz_transfer_target(std::string_view stream) {
  int fds[2];
  CRESCENT_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  crescent::net::Fd peer(fds[0]);
  crescent::net::Fd target(fds[1]);
  int buf_bytes = 1 << 20;
  setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buf_bytes, sizeof(buf_bytes));
  setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buf_bytes, sizeof(buf_bytes));
  // The whole stream is queued up front (inputs are far below the socket buffer), then the
  // peer's side is shut so a frame cut short ends in EOF, not in a wait.
  size_t sent = 0;
  while (sent < stream.size()) {
    ssize_t n = send(fds[0], stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL);
    CRESCENT_CHECK(n > 0) << "socketpair send failed";
    sent += static_cast<size_t>(n);
  }
  shutdown(fds[0], SHUT_WR);

  std::vector<uint8_t> mem1(256, 0), mem2(4096, 0);
  tr::RegionTable regions;
  tr::Region region1;
  region1.addr = mem1.data();
  region1.length = mem1.size();
  tr::Region region2;
  region2.addr = mem2.data();
  region2.length = mem2.size();
  tr::RegionId id1 = regions.add(region1);
  tr::RegionId id2 = regions.add(region2);
  std::atomic<uint64_t> data_epoch{0};
  tr::TargetContext ctx;
  ctx.regions = &regions;
  ctx.io_timeout = std::chrono::milliseconds(2000);
  ctx.data_epoch = &data_epoch;

  std::map<uint64_t, std::vector<tr::RegionId>> leases;
  std::set<int64_t> described;
  Status s;
  while (s.is_ok()) {
    auto h = crescent::net::read_frame_header(
        target, tr::wire::kPieceHeaderBytes + tr::wire::kMaxPieceBytes,
        crescent::Deadline::never());
    if (!h.is_ok()) {
      break;
    }
    switch (h->type) {
      case tr::wire::kWriteData:
      case tr::wire::kReadReq:
        s = tr::serve_tcp_piece(ctx, target, *h);
        break;
      case tr::wire::kWriteGroup:
      case tr::wire::kReadGroup:
        s = tr::serve_tcp_group(ctx, target, *h);
        break;
      case tr::wire::kLease:
        s = tr::serve_lease(ctx, target, *h, &leases, &described);
        break;
      case tr::wire::kRelease:
        s = tr::serve_release(ctx, target, *h, &leases);
        break;
      default:
        s = crescent::data_loss("unexpected frame");
        break;
    }
    drain(fds[0]);
  }
  // What the server does when a connection ends: unpin what its leases still hold.
  for (auto& [lease, pinned] : leases) {
    for (tr::RegionId region : pinned) {
      regions.unpin(region);
    }
  }
  // No pin is left behind: removal would wait for one (and time out).
  CRESCENT_CHECK(regions.remove(id1, crescent::Deadline::after_ms(0)).is_ok());
  CRESCENT_CHECK(regions.remove(id2, crescent::Deadline::after_ms(0)).is_ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  std::string_view payload(reinterpret_cast<const char*>(data + 1), size - 1);
  auto enc = [](const auto& m) { return kv::encode(m); };
  auto ece = [](const auto& m) { return ec::encode(m); };
  switch (data[0] % 21) {
    case 0:
      round_trip(payload, kv::decode_hello, enc);
      break;
    case 1:
      round_trip(payload, kv::decode_hello_ok, enc);
      break;
    case 2:
      round_trip(
          payload, [](std::string_view p) { return kv::decode_refused(p); }, enc);
      break;
    case 3:
      round_trip(payload, kv::decode_ask, enc);
      break;
    case 4:
      round_trip(
          payload, [](std::string_view p) { return kv::decode_transfer_ref(p, "CANCEL"); }, enc);
      break;
    case 5:
      round_trip(payload, kv::decode_done, enc);
      break;
    case 6:
      round_trip(payload, ec::decode_hello, ece);
      break;
    case 7:
      round_trip(payload, ec::decode_hello_ok, ece);
      break;
    case 8:
      round_trip(payload, ec::decode_refused, ece);
      break;
    case 9:
      round_trip(payload, ec::decode_acquire, ece);
      break;
    case 10:
      round_trip(payload, ec::decode_acquired, ece);
      break;
    case 11:
      round_trip(payload, ec::decode_acquire_failed, ece);
      break;
    case 12:
      round_trip(payload, ec::decode_release, ece);
      round_trip(payload, ec::decode_released, ece);
      break;
    case 13:
      fuzz_ec_transfer_params(payload);
      break;
    case 14:
    case 15:
    case 16:
    case 17:
    case 18:
      fuzz_bootstrap(data[0] % 21 - 14, payload);
      break;
    case 19:
      fuzz_transfer_pieces(payload);
      break;
    default:
      fuzz_transfer_target(payload);
      break;
  }
  return 0;
}
