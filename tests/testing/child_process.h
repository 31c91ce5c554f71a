#pragma once
// A child process of the real `crescent` binary (serve, proxy, bootstrap, ...): the launcher of
// every multi-process test. Its stdout and stderr are read by a thread into a buffer (so a
// chatty child never blocks on a full pipe), its HTTP port is read from its "listening on
// http://HOST:PORT" line, and it can be sent any signal. The destructor SIGKILLs it.
// Thread-safe: output() and raw_output() may be called while the drain thread runs; the other
// methods are for the thread that owns the object.

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::testing {

class ChildProcess {
 public:
  // Starts `crescent args...` (the build's binary, or $CRESCENT_TEST_BINARY when set); name
  // labels its output in failure messages. The child is SIGKILLed when the calling thread
  // exits (PR_SET_PDEATHSIG), so call this from a thread that outlives it (the test's).
  static Result<std::unique_ptr<ChildProcess>> start(std::string name,
                                                     std::vector<std::string> args);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The port of the first "listening on http://H:PORT" line; an error (with the output so
  // far) if the process exits or the deadline passes first.
  Result<int> wait_for_port(Deadline deadline);
  // Polls GET path on 127.0.0.1:port until it answers 200.
  Status wait_healthy(int port, Deadline deadline, const std::string& path = "/health");

  // Sends sig (no wait).
  void signal(int sig);
  // Waits for the exit: its code, 128+N when killed by signal N, -1 when still running at the
  // deadline. Once it has exited, also waits (up to 5 s) for its output to be read to the end.
  int wait_exit(Deadline deadline);
  // Sends SIGTERM and waits for the exit (as wait_exit); -1 also when it was already reaped.
  int terminate(Deadline deadline);
  // SIGKILL and reap.
  void kill_now();
  bool is_running();
  // Whether kill_now() ended it (as opposed to exiting by itself).
  bool was_killed() const { return was_killed_; }
  // Its exit code once reaped (see wait_exit), -1 before.
  int exit_code() const { return exit_code_; }

  const std::string& name() const { return name_; }
  // Its pid while it runs, -1 once reaped.
  pid_t pid() const { return pid_; }
  // Once the process has exited: waits until its output has been read to the end (false when
  // it is still running, or something else still holds its pipe at the deadline).
  bool wait_drained(Deadline deadline = Deadline::after_ms(5000));
  // Everything written so far, each line prefixed with "[name] " (for failure messages that
  // mix several processes).
  std::string output() const;
  // Everything written so far, exactly as written.
  std::string raw_output() const;

 private:
  ChildProcess(std::string name, pid_t pid, int out_fd);
  void drain();
  // Reaps the process if it has exited (block: waits for it); true once it is reaped.
  bool reap(bool block);

  std::string name_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int exit_code_ = -1;  // set once reaped
  bool was_killed_ = false;
  mutable std::mutex mu_;
  std::condition_variable drained_cv_;
  std::string output_;    // GUARDED_BY(mu_)
  bool drained_ = false;  // GUARDED_BY(mu_): the pipe reached end of file
  std::thread drain_thread_;
};

// For launchers whose constructors cannot return an error (ServeProcess, ProxyProcess, ...):
// start() that aborts the test binary with the reason when the process cannot be started.
std::unique_ptr<ChildProcess> start_or_abort(std::string name, std::vector<std::string> args);
// For the same launchers when the child did not come up: prints "crescent NAME exited early:"
// if it has exited, else "crescent NAME <not_up>:", then everything it wrote (read to the end
// if it has exited), to stderr, and aborts the test binary.
[[noreturn]] void abort_not_up(ChildProcess* child, const std::string& not_up);

}  // namespace crescent::testing
