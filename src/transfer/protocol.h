#pragma once
// Pieces of the transfer protocol (wire.h) shared by the transports and the engine core:
// statuses on the wire, deadlines for one frame, hex, and the HELLO exchange
// (preceded by net/auth/handshake.h when the engine has a token)
// that opens every connection. Internal to the transfer module.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/status.h"
#include "net/frame.h"
#include "net/socket.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {

class RegionTable;

Deadline earliest(Deadline a, Deadline b);
// A frame that has started must finish within io_timeout.
Deadline io_deadline(std::chrono::milliseconds io_timeout);

void write_status(net::ByteWriter& w, const Status& s);
Status read_status(net::ByteReader& r);
// A status in a GROUP_ACK: its text is cut so that a whole group's statuses stay bounded.
void write_group_status(net::ByteWriter& w, const Status& s);

// The inverse of net::auth::to_hex (lower-case hex).
Result<std::string> from_hex(std::string_view hex);

// "unix:@NAME" or "tcp:HOST:PORT".
Result<net::Fd> connect_address(const std::string& address, Deadline deadline);

struct LinkConfig {
  std::string my_name;
  std::string token;  // shared secret for net/auth/handshake.h; empty: no authentication
  TransportKind transport = TransportKind::kTcp;
  std::chrono::milliseconds io_timeout{10'000};
};

// Connects and performs the HELLO exchange.
Result<net::Fd> connect_and_hello(const LinkConfig& cfg, const SegmentDescriptor& peer,
                                  uint32_t conn_index, Deadline deadline);

// What a transport's target-side frame handlers use of the server that accepted the connection.
struct TargetContext {
  RegionTable* regions = nullptr;
  std::chrono::milliseconds io_timeout{10'000};
  // Bumped (release) after bytes land in a region; a NOTIFY acquires it, so bytes written
  // before a notification happen-before its callback (what a race checker needs to see).
  std::atomic<uint64_t>* data_epoch = nullptr;
};

}  // namespace crescent::transfer
