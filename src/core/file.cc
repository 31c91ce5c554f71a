#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/errno_text.h"

namespace crescent {
namespace {

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
  // One byte more than the file's length, so that the read that finds the end needs no growth.
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  std::string out(regular ? static_cast<size_t>(st.st_size) + 1 : size_t{4096}, '\0');
  size_t used = 0;
  while (true) {
    if (used == out.size()) {
      out.resize(2 * used);  // longer than fstat said, or no length at all (/proc, pipes)
    }
    const ssize_t n = read_some(fd, out.data() + used, out.size() - used);
    if (n < 0) {
      return data_loss("cannot read " + path + ": " + errno_text(errno));
    }
    if (n == 0) {
      break;
    }
    used += static_cast<size_t>(n);
  }
  out.resize(used);
  return out;
}

}  // namespace crescent
