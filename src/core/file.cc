#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace crescent {
namespace {

// strerror() is not thread-safe; the error category's message is.
std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// read(2) that retries when a signal interrupts it.
ssize_t read_some(int fd, char* data, size_t size) {
  ssize_t n;
  do {
    n = ::read(fd, data, size);
  } while (n < 0 && errno == EINTR);
  return n;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace

Result<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return not_found("cannot open " + path + ": " + errno_text(errno));
  }
  FdCloser closer(fd);
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    out.resize(static_cast<size_t>(st.st_size));
  }
  size_t used = 0;
  char probe[4096];
  while (true) {
    if (used < out.size()) {
      const ssize_t n = read_some(fd, out.data() + used, out.size() - used);
      if (n < 0) {
        return data_loss("cannot read " + path + ": " + errno_text(errno));
      }
      if (n == 0) {
        break;  // shorter than fstat said: it shrank since
      }
      used += static_cast<size_t>(n);
      continue;
    }
    // The buffer is full: a small read tells the end from more data without growing it.
    const ssize_t n = read_some(fd, probe, sizeof(probe));
    if (n < 0) {
      return data_loss("cannot read " + path + ": " + errno_text(errno));
    }
    if (n == 0) {
      break;
    }
    out.resize(used + std::max(used, size_t{64} << 10));
    std::memcpy(out.data() + used, probe, static_cast<size_t>(n));
    used += static_cast<size_t>(n);
  }
  out.resize(used);
  return out;
}

}  // namespace crescent
