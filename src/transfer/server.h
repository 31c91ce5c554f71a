#pragma once
// The target side of every transport: accepts connections on the engine's listener (tcp, or
// an abstract unix socket for shm), authenticates each peer when it has a
// token (net/auth/handshake.h), checks each HELLO (protocol version, transport),
// then serves the connection's frames on its own thread, handing data frames to the
// transport's handlers (tcp/tcp_target.h; lease_target.h for shm and ucx) and NOTIFY frames to
// the engine's callback. Internal to the transfer module.

#include <chrono>
#include <memory>
#include <string>

#include "net/socket.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {

class RegionTable;

class TransferServer {
 public:
  TransferServer(TransportKind transport, std::string token, RegionTable* regions,
                 NotificationCallback on_notification, std::chrono::milliseconds io_timeout,
                 std::string name);
  ~TransferServer();
  TransferServer(const TransferServer&) = delete;
  TransferServer& operator=(const TransferServer&) = delete;

  void start(net::Fd listener);
  // Stops accepting, closes every connection and joins their threads (idempotent).
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::transfer
