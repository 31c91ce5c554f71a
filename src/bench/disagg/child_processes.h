#pragma once
// The processes a benchmark starts itself (servers and a proxy running this binary), and the
// SIGINT/SIGTERM handling that stops them. A child gets SIGKILL if the benchmark dies
// (PR_SET_PDEATHSIG), so no deployment outlives the command that started it.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace crescent::bench {

// Thread-safe: the interrupt watcher calls signal_all() while the main thread reaps. The
// destructor stops whatever still runs (10 s grace).
class ChildProcesses {
 public:
  ChildProcesses() = default;
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;
  ~ChildProcesses() { stop_all(std::chrono::seconds(10)); }

  // Starts `binary args...` (args without argv[0]) with stdin from /dev/null and stdout and
  // stderr appended to log_path; returns its index. `name` names it in messages.
  Result<int> start(const std::string& name, const std::string& binary,
                    std::vector<std::string> args, const std::string& log_path);

  // False once the child exited (reaps it and keeps its exit code).
  bool is_running(int i);
  // "exit code N" or "killed by signal N", once is_running() said false.
  std::string describe_exit(int i);
  // -1 once reaped.
  pid_t pid(int i);
  [[nodiscard]] const std::string& log_path(int i) const;

  // Sends sig to every child still running.
  void signal_all(int sig);
  // SIGTERM (newest first: a proxy before its servers), then SIGKILL after `grace`.
  void stop_all(std::chrono::milliseconds grace);

 private:
  struct Child {
    std::string name;
    std::string log_path;
    pid_t pid = -1;
    int exit_code = -1;
  };
  static bool is_running_locked(Child& c);

  std::mutex mu_;
  std::vector<Child> children_;  // GUARDED_BY(mu_) (pid, exit_code)
};

// Takes SIGINT/SIGTERM on a thread of its own while it lives: they are blocked on the thread
// that creates it (and so on the threads that one starts afterwards; children unblock them),
// so a signal sent to the process lands here as long as no earlier thread leaves them open.
// The first one marks the run interrupted and sends SIGTERM to the children, which ends any
// request or wait in flight. The old signal mask comes back at destruction.
class InterruptWatcher {
 public:
  explicit InterruptWatcher(ChildProcesses* children);
  InterruptWatcher(const InterruptWatcher&) = delete;
  InterruptWatcher& operator=(const InterruptWatcher&) = delete;
  ~InterruptWatcher();
  [[nodiscard]] bool is_interrupted() const { return is_interrupted_.load(); }
  // The watching thread's id once it runs (0 before): tests signal it alone (tgkill).
  [[nodiscard]] pid_t thread_id() const { return thread_id_.load(); }

 private:
  void watch();

  ChildProcesses* children_;
  sigset_t signals_;
  sigset_t old_mask_;
  std::atomic<bool> is_done_{false};
  std::atomic<bool> is_interrupted_{false};
  std::atomic<pid_t> thread_id_{0};
  std::thread thread_;
};

}  // namespace crescent::bench
