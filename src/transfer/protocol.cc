#include "transfer/protocol.h"

#include <string>

#include "net/auth/handshake.h"
#include "transfer/wire.h"

namespace crescent::transfer {

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

// Connects and performs the HELLO exchange.
Result<Fd> connect_and_hello(const LinkConfig& cfg, const SegmentDescriptor& peer,
                             uint32_t conn_index, Deadline deadline) {
  ASSIGN_OR_RETURN(Fd fd, connect_address(peer.address, deadline));
  const std::string peer_name = "transfer peer at " + peer.address;
  RETURN_IF_ERROR(net::auth::authenticate_to_server(fd, cfg.token, peer_name, deadline));
  ByteWriter w;
  w.u32(wire::kProtocolVersion);
  w.u8(static_cast<uint8_t>(cfg.transport));
  w.bytes(cfg.my_name);
  w.bytes("");  // was a clear-text token; the handshake above replaces it

  w.u32(conn_index);
  RETURN_IF_ERROR(net::write_frame(fd, wire::kHello, w.str(), deadline));
  ASSIGN_OR_RETURN(net::Frame reply, net::read_frame(fd, wire::kMaxHelloBytes, deadline));
  RETURN_IF_ERROR(net::auth::refusal_in_reply(reply, peer_name));
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

}  // namespace crescent::transfer
