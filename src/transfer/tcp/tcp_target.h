#pragma once
// The tcp transport's target side: the data frames of one connection (WRITE_DATA, READ_REQ,
// WRITE_GROUP, READ_GROUP; wire.h). Every op is checked and pinned before any byte moves; a
// refused op's payload is drained, never stored. Internal to the transfer module.

#include "core/status.h"
#include "net/frame.h"
#include "net/socket.h"
#include "transfer/protocol.h"

namespace crescent::transfer {

// A WRITE_DATA or READ_REQ whose header `h` has been read; answers ACK or READ_RESP.
Status serve_tcp_piece(const TargetContext& ctx, const net::Fd& fd, const net::FrameHeader& h);
// A WRITE_GROUP or READ_GROUP: the whole op table is read and every op checked and pinned
// before any payload byte is stored; answers GROUP_ACK.
Status serve_tcp_group(const TargetContext& ctx, const net::Fd& fd, const net::FrameHeader& h);

}  // namespace crescent::transfer
