#pragma once
// A `crescent bootstrap` child process for tests: started with the given flags, its output
// (stdout and stderr) captured, its port read from the "listening on http://HOST:PORT" line.
// A thin wrapper over testing::ChildProcess.

#include <memory>
#include <string>
#include <vector>

namespace crescent::testing {

class ChildProcess;

class BootstrapProcess {
 public:
  // Starts `crescent bootstrap ARGS...`. Does not wait for anything.
  explicit BootstrapProcess(std::vector<std::string> args);
  ~BootstrapProcess();  // SIGKILL if still running
  BootstrapProcess(const BootstrapProcess&) = delete;
  BootstrapProcess& operator=(const BootstrapProcess&) = delete;

  // Waits up to timeout_ms for the "listening on" line; its port, or 0 (the process exited or
  // said nothing in time).
  int wait_for_port(int timeout_ms);
  // Waits up to timeout_ms for the process to exit by itself; its exit code (128+N: killed by
  // signal N), -1 if it did not exit in time.
  int wait_exit(int timeout_ms);
  // Sends SIGTERM, then wait_exit(timeout_ms).
  int terminate(int timeout_ms);
  // Everything it wrote so far.
  std::string output();

 private:
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace crescent::testing
