#pragma once
// Small socket helpers shared by crescent's network code: an owning file descriptor, TCP and
// unix-domain listen/connect/accept with deadlines, exact reads and writes with deadlines, and
// passing file descriptors over unix sockets (SCM_RIGHTS). All sockets made here are
// non-blocking; every wait goes through poll() with the remaining time of a Deadline.
// Thread-safety: the functions are stateless; one Fd may be read by one thread while another
// writes it, and shutdown_both() from any thread wakes both.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::net {

// Owns a file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool is_valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Binds exactly host:port (port 0: the kernel picks one) and listens. host must be a numeric
// IPv4 address; nothing else is bound.
Result<Fd> listen_tcp(const std::string& host, int port, int backlog = 64);
// Listens on a unix socket in the abstract namespace (no file on disk) named `name`.
Result<Fd> listen_unix_abstract(const std::string& name, int backlog = 64);
// The local port of a bound TCP socket.
Result<int> local_port(const Fd& fd);

Result<Fd> connect_tcp(const std::string& host, int port, Deadline deadline);
Result<Fd> connect_unix_abstract(const std::string& name, Deadline deadline);
// Waits for one connection; DeadlineExceeded when none arrives in time, Cancelled when
// `wake_fd` (an eventfd or pipe, -1 for none) becomes readable.
Result<Fd> accept_with_deadline(const Fd& listener, Deadline deadline, int wake_fd = -1);

// Splits "host:port"; port must be 1..65535.
Status parse_host_port(const std::string& text, std::string* host, int* port);

// TCP_NODELAY and large socket buffers, for bulk streams.
void tune_tcp_stream(const Fd& fd);

// Reads exactly `bytes` bytes. A peer that closes first gives Unavailable ("connection closed"),
// a deadline gives DeadlineExceeded. If fds is not null, descriptors passed with SCM_RIGHTS
// alongside these bytes are appended to it.
Status read_exact(const Fd& fd, void* data, size_t bytes, Deadline deadline,
                  std::vector<Fd>* fds = nullptr);
// Fills all of the buffers in order (a scatter read straight into them), same statuses.
Status read_exact(const Fd& fd, std::span<const iovec> buffers, Deadline deadline);
// Writes all of the buffers in order (scatter-gather; no copy into a staging buffer).
Status write_all(const Fd& fd, std::span<const iovec> buffers, Deadline deadline);
Status write_all(const Fd& fd, const void* data, size_t bytes, Deadline deadline);
// Writes data and passes `fds_to_send` (SCM_RIGHTS) with its first byte. Unix sockets only.
Status write_with_fds(const Fd& fd, const void* data, size_t bytes,
                      std::span<const int> fds_to_send, Deadline deadline);
// Shuts the socket down in both directions so that threads blocked on it wake up.
void shutdown_both(const Fd& fd);

}  // namespace crescent::net
