#pragma once
// A TCP port on 127.0.0.1 that nothing listens on now, for a child process to listen on.
//
// Picked below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): a port
// from bind(0) is an ephemeral one, and between our close() and the child's bind() any process
// on the machine may take it for an outgoing connection or its own bind(0). Under ctest -j,
// with hundreds of connections a second, that happened ("Address already in use"). Ports below
// the range are only ever given out by a bind that names them, i.e. by another pick like this
// one, drawn at random from ~10,000 ports. Header-only: the test helpers of several directories
// share it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace crescent::testing {

// Binds a socket to 127.0.0.1:port (0: the kernel's pick), closes it, and returns the port it
// got, or 0 when the bind failed.
inline int bind_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return 0;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      bound_port = ntohs(addr.sin_port);
    }
  }
  ::close(fd);
  return bound_port;
}

inline int pick_free_port() {
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> ephemeral_low;
  const int low = 10000;
  const int high = ephemeral_low - 1;
  if (high - low >= 1000) {
    static thread_local std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(low, high);
    for (int attempt = 0; attempt < 64; ++attempt) {
      int port = pick(rng);
      if (bind_loopback(port) == port) {
        return port;
      }
    }
  }
  return bind_loopback(0);  // no room below the ephemeral range: the kernel's pick
}

}  // namespace crescent::testing
