#include "net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errno_text.h"

namespace crescent::net {

namespace {

Status errno_status(const std::string& what, int err) {
  std::string msg = what + ": " + errno_text(err);
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED:
      return unavailable(msg);
    case EADDRINUSE:
      return already_exists(msg);
    case EACCES:
    case EPERM:
      return permission_denied(msg);
    default:
      return internal_error(msg);
  }
}

int poll_timeout_ms(Deadline deadline) {
  if (deadline.when() == TimePoint::max())
    return -1;
  auto ns = deadline.remaining().count();
  // Round up so that a wait never returns early and spins.
  int64_t ms = (ns + 999'999) / 1'000'000;
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until fd is ready for `events`; DeadlineExceeded when time runs out.
Status wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int timeout = poll_timeout_ms(deadline);
    int rc = ::poll(&p, 1, timeout);
    if (rc > 0)
      return Status::ok();  // readiness or error: the next syscall reports which
    if (rc == 0) {
      if (deadline.is_expired())
        return deadline_exceeded("socket wait timed out");
      continue;
    }
    if (errno == EINTR)
      continue;
    return errno_status("poll", errno);
  }
}

Result<Fd> make_socket(int domain) {
  int fd = ::socket(domain, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errno_status("socket", errno);
  return Fd(fd);
}

Status fill_ipv4(const std::string& host, int port, sockaddr_in* addr) {
  if (port < 0 || port > 65535)
    return invalid_argument("bad port " + std::to_string(port));
  std::memset(addr, 0, sizeof(*addr));
  addr->sin_family = AF_INET;
  addr->sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr->sin_addr) != 1) {
    return invalid_argument("not a numeric IPv4 address: '" + host + "'");
  }
  return Status::ok();
}

Status fill_abstract(const std::string& name, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr->sun_path)) {
    return invalid_argument("bad unix socket name '" + name + "'");
  }
  // A leading NUL puts the name in the abstract namespace.
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return Status::ok();
}

Result<Fd> connect_addr(int domain, const sockaddr* addr, socklen_t len, Deadline deadline,
                        const std::string& what) {
  ASSIGN_OR_RETURN(Fd fd, make_socket(domain));
  if (::connect(fd.get(), addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN)
      return errno_status("connect " + what, errno);
    RETURN_IF_ERROR(wait_ready(fd.get(), POLLOUT, deadline).with_context("connect " + what));
    int err = 0;
    socklen_t err_len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &err_len);
    if (err != 0)
      return errno_status("connect " + what, err);
  }
  return fd;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other)
    reset(other.release());
  return *this;
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = fd;
}

Result<Fd> listen_tcp(const std::string& host, int port, int backlog) {
  sockaddr_in addr{};
  RETURN_IF_ERROR(fill_ipv4(host, port, &addr));
  ASSIGN_OR_RETURN(Fd fd, make_socket(AF_INET));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return errno_status("bind " + host + ":" + std::to_string(port), errno);
  }
  if (::listen(fd.get(), backlog) != 0)
    return errno_status("listen", errno);
  return fd;
}

Result<Fd> listen_unix_abstract(const std::string& name, int backlog) {
  sockaddr_un addr{};
  socklen_t len = 0;
  RETURN_IF_ERROR(fill_abstract(name, &addr, &len));
  ASSIGN_OR_RETURN(Fd fd, make_socket(AF_UNIX));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return errno_status("bind @" + name, errno);
  }
  if (::listen(fd.get(), backlog) != 0)
    return errno_status("listen", errno);
  return fd;
}

Result<int> local_port(const Fd& fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return errno_status("getsockname", errno);
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<Fd> connect_tcp(const std::string& host, int port, Deadline deadline) {
  sockaddr_in addr{};
  RETURN_IF_ERROR(fill_ipv4(host, port, &addr));
  return connect_addr(AF_INET, reinterpret_cast<sockaddr*>(&addr), sizeof(addr), deadline,
                      host + ":" + std::to_string(port));
}

Result<Fd> connect_unix_abstract(const std::string& name, Deadline deadline) {
  sockaddr_un addr{};
  socklen_t len = 0;
  RETURN_IF_ERROR(fill_abstract(name, &addr, &len));
  return connect_addr(AF_UNIX, reinterpret_cast<sockaddr*>(&addr), len, deadline, "@" + name);
}

Result<Fd> accept_with_deadline(const Fd& listener, Deadline deadline, int wake_fd) {
  for (;;) {
    int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0)
      return Fd(fd);
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return errno_status("accept", errno);
    pollfd p[2] = {{listener.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int rc = ::poll(p, wake_fd >= 0 ? 2 : 1, poll_timeout_ms(deadline));
    if (rc < 0 && errno != EINTR)
      return errno_status("poll", errno);
    if (rc > 0 && wake_fd >= 0 && (p[1].revents & POLLIN) != 0)
      return cancelled("accept woken");
    if (rc == 0 && deadline.is_expired())
      return deadline_exceeded("no connection in time");
  }
}

Status parse_host_port(const std::string& text, std::string* host, int* port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalid_argument("expected HOST:PORT, got '" + text + "'");
  }
  std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || p < 1 || p > 65535) {
    return invalid_argument("bad port in '" + text + "'");
  }
  *host = text.substr(0, colon);
  *port = static_cast<int>(p);
  return Status::ok();
}

void tune_tcp_stream(const Fd& fd) {
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int bytes = 4 << 20;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

Status read_exact(const Fd& fd, void* data, size_t bytes, Deadline deadline, std::vector<Fd>* fds) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n;
    if (fds != nullptr) {
      iovec iov{p + done, bytes - done};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      n = ::recvmsg(fd.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n > 0) {
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; ++i) {
              int received;
              std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
              fds->emplace_back(received);
            }
          }
        }
        if ((msg.msg_flags & MSG_CTRUNC) != 0)
          return data_loss("file descriptors truncated");
      }
    } else {
      n = ::recv(fd.get(), p + done, bytes - done, MSG_DONTWAIT);
    }
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      return unavailable("connection closed by peer");
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return errno_status("recv", errno);
    RETURN_IF_ERROR(wait_ready(fd.get(), POLLIN, deadline));
  }
  return Status::ok();
}

namespace {
// Consumes `n` transferred bytes from the front of iov[first..], moving `first` past the
// buffers that are complete (partial sendmsg/recvmsg).
void advance_iov(std::vector<iovec>& iov, size_t& first, size_t n) {
  while (n > 0 && first < iov.size()) {
    size_t take = std::min(n, iov[first].iov_len);
    iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
    iov[first].iov_len -= take;
    n -= take;
    if (iov[first].iov_len == 0)
      ++first;
  }
}
}  // namespace

Status read_exact(const Fd& fd, std::span<const iovec> buffers, Deadline deadline) {
  std::vector<iovec> iov(buffers.begin(), buffers.end());
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::recvmsg(fd.get(), &msg, MSG_DONTWAIT);
    if (n == 0)
      return unavailable("connection closed by peer");
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return errno_status("recv", errno);
      RETURN_IF_ERROR(wait_ready(fd.get(), POLLIN, deadline));
      continue;
    }
    advance_iov(iov, first, static_cast<size_t>(n));
  }
  return Status::ok();
}

Status write_all(const Fd& fd, std::span<const iovec> buffers, Deadline deadline) {
  std::vector<iovec> iov(buffers.begin(), buffers.end());
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return errno_status("send", errno);
      RETURN_IF_ERROR(wait_ready(fd.get(), POLLOUT, deadline));
      continue;
    }
    advance_iov(iov, first, static_cast<size_t>(n));
  }
  return Status::ok();
}

Status write_all(const Fd& fd, const void* data, size_t bytes, Deadline deadline) {
  iovec iov{const_cast<void*>(data), bytes};
  return write_all(fd, std::span<const iovec>(&iov, 1), deadline);
}

Status write_with_fds(const Fd& fd, const void* data, size_t bytes,
                      std::span<const int> fds_to_send, Deadline deadline) {
  if (fds_to_send.empty())
    return write_all(fd, data, bytes, deadline);
  if (bytes == 0)
    return invalid_argument("descriptors need at least one data byte");
  if (fds_to_send.size() > 64)
    return invalid_argument("at most 64 descriptors per message");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  std::memset(control, 0, sizeof(control));
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds_to_send.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds_to_send.size());
  std::memcpy(CMSG_DATA(c), fds_to_send.data(), sizeof(int) * fds_to_send.size());
  for (;;) {
    ssize_t n = ::sendmsg(fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      auto sent = static_cast<size_t>(n);
      if (sent == bytes)
        return Status::ok();
      // The descriptors went with the first byte; the rest is plain data.
      return write_all(fd, static_cast<const char*>(data) + sent, bytes - sent, deadline);
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return errno_status("sendmsg", errno);
    RETURN_IF_ERROR(wait_ready(fd.get(), POLLOUT, deadline));
  }
}

void shutdown_both(const Fd& fd) {
  if (fd.is_valid())
    ::shutdown(fd.get(), SHUT_RDWR);
}

}  // namespace crescent::net
