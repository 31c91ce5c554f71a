#pragma once
// The tcp transport's initiator side: a link of several connections to one peer, each with a
// sender thread (WRITE_DATA with the payload straight from the caller's memory, READ_REQ, and
// WRITE_GROUP / READ_GROUP for small ops) and a receiver thread (ACK, GROUP_ACK; READ_RESP
// received straight into the caller's memory). Internal to the transfer module.

#include <chrono>
#include <memory>
#include <vector>

#include "net/socket.h"
#include "transfer/link.h"

namespace crescent::transfer {

// `fds` are connections that completed the HELLO exchange.
std::shared_ptr<Link> make_tcp_link(PieceSink* sink, std::vector<net::Fd> fds,
                                    std::chrono::milliseconds io_timeout);

}  // namespace crescent::transfer
