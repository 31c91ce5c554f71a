#pragma once
// A `crescent proxy` child process for multi-process tests: started with the given flags on a
// free port (--port 0; the port is read from its "listening on" line), and stopped with
// SIGTERM. run_proxy_to_exit() runs the binary to completion, for usage errors and --help.
// Thin wrappers over testing::ChildProcess.

#include <memory>
#include <string>
#include <vector>

namespace crescent::testing {

class ChildProcess;

class ProxyProcess {
 public:
  // Aborts the test binary with the process's output if it does not listen within timeout_s.
  explicit ProxyProcess(std::vector<std::string> args, int timeout_s = 30);
  ~ProxyProcess();  // SIGKILL if still running
  ProxyProcess(const ProxyProcess&) = delete;
  ProxyProcess& operator=(const ProxyProcess&) = delete;

  int port() const { return port_; }
  // Sends SIGTERM and waits up to timeout_s; the exit code (-1: did not exit or was already
  // reaped, 128+N: signal N).
  int terminate(int timeout_s = 30);
  // Everything the process wrote to stdout and stderr so far.
  std::string output();

 private:
  std::unique_ptr<ChildProcess> child_;
  int port_ = 0;
};

struct ExitResult {
  int exit_code = -1;  // -1: still running after timeout_s (then killed)
  std::string output;  // stdout and stderr
};
// Runs `crescent proxy ARGS...` to its end.
ExitResult run_proxy_to_exit(const std::vector<std::string>& args, int timeout_s = 30);

}  // namespace crescent::testing
