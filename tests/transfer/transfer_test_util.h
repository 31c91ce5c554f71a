#pragma once
// Helpers shared by the transfer tests and their peer process: a seeded byte pattern, a
// checksum, and a child process driven over pipes with deadlines.

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::testutil {

void fill_pattern(uint8_t* data, uint64_t bytes, uint64_t seed);
uint64_t fnv1a(const uint8_t* data, uint64_t bytes);

// A child process with stdin/stdout pipes. The destructor kills (SIGKILL) and reaps it.
class Child {
 public:
  static Result<Child> spawn(const std::vector<std::string>& argv);
  Child() = default;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  ~Child();

  Status send_line(const std::string& line);
  Result<std::string> read_line(Deadline deadline);
  // Sends a command and returns the reply line.
  Result<std::string> ask(const std::string& line, Deadline deadline);
  void kill_now(int sig = SIGKILL);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int in_fd_ = -1;   // our end of the child's stdin
  int out_fd_ = -1;  // our end of the child's stdout
  std::string buffer_;
};

}  // namespace crescent::testutil
