#pragma once
// A `crescent serve` child process for integration tests: started with the given flags on a
// free port (--port 0, the port is read from its "listening on" line), waited for until
// /health answers 200, and stopped with SIGTERM (its exit status is kept for the test).
// A thin wrapper over testing::ChildProcess.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace crescent::testing {

class ChildProcess;

class ServeProcess {
 public:
  // Aborts the test binary with a message if the server does not come up within timeout_s.
  explicit ServeProcess(std::vector<std::string> extra_args, int timeout_s = 60);
  ~ServeProcess();  // SIGKILL if still running
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  // Its pid until terminate() has reaped it, then -1.
  pid_t pid() const;
  // Sends SIGTERM and waits up to timeout_s; returns the exit code (-1: did not exit or was
  // already reaped, 128+N: killed by signal N).
  int terminate(int timeout_s = 30);
  // Everything the process wrote to stdout/stderr so far.
  std::string output();

 private:
  std::unique_ptr<ChildProcess> child_;
  int port_ = 0;
};

}  // namespace crescent::testing
