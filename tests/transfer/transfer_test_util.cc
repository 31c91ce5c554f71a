#include "tests/transfer/transfer_test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace crescent::testutil {

void fill_pattern(uint8_t* data, uint64_t bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data + i, &x, 8);
  }
  for (; i < bytes; ++i) {
    data[i] = static_cast<uint8_t>(i * 31 + seed);
  }
}

uint64_t fnv1a(const uint8_t* data, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < bytes; ++i) {
    h = (h ^ data[i]) * 1099511628211ull;
  }
  return h;
}

Result<Child> Child::spawn(const std::vector<std::string>& argv) {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    return internal_error("pipe failed");
  }
  std::vector<char*> args;
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0)
    return internal_error("fork failed");
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  Child c;
  c.pid_ = pid;
  c.in_fd_ = to_child[1];
  c.out_fd_ = from_child[0];
  return c;
}

Child::Child(Child&& other) noexcept {
  *this = std::move(other);
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    kill_now();
    pid_ = other.pid_;
    in_fd_ = other.in_fd_;
    out_fd_ = other.out_fd_;
    buffer_ = std::move(other.buffer_);
    other.pid_ = -1;
    other.in_fd_ = -1;
    other.out_fd_ = -1;
  }
  return *this;
}

Child::~Child() {
  kill_now();
}

void Child::kill_now(int sig) {
  if (pid_ > 0) {
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  if (in_fd_ >= 0)
    ::close(in_fd_);
  if (out_fd_ >= 0)
    ::close(out_fd_);
  in_fd_ = -1;
  out_fd_ = -1;
}

Status Child::send_line(const std::string& line) {
  std::string s = line + "\n";
  if (::write(in_fd_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) {
    return unavailable("child stdin closed");
  }
  return Status::ok();
}

Result<std::string> Child::read_line(Deadline deadline) {
  for (;;) {
    auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd p{out_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(deadline.remaining_ms()) + 1);
    if (rc == 0 && deadline.is_expired())
      return deadline_exceeded("child did not answer");
    if (rc < 0 && errno != EINTR)
      return internal_error("poll failed");
    if (rc <= 0)
      continue;
    char buf[65536];
    ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n <= 0)
      return unavailable("child closed its stdout");
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

Result<std::string> Child::ask(const std::string& line, Deadline deadline) {
  RETURN_IF_ERROR(send_line(line));
  return read_line(deadline);
}

}  // namespace crescent::testutil
