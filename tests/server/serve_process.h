#pragma once
// A `crescent serve` child process for integration tests: started with the given flags on a
// free port (--port 0, the port is read from its first line of output), waited for until
// /health answers 200, and stopped with SIGTERM (its exit status is kept for the test).

#include <sys/types.h>

#include <string>
#include <vector>

namespace crescent::testing {

class ServeProcess {
 public:
  // Aborts the test binary with a message if the server does not come up within timeout_s.
  explicit ServeProcess(std::vector<std::string> extra_args, int timeout_s = 60);
  ~ServeProcess();  // SIGKILL if still running

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Sends SIGTERM and waits up to timeout_s; returns the exit code (-1: did not exit,
  // 128+N: killed by signal N).
  int terminate(int timeout_s = 30);
  // Everything the process wrote to stdout/stderr so far.
  std::string output();

 private:
  void drain_output(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  std::string output_;
};

}  // namespace crescent::testing
