#include "bench/disagg/child_processes.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ranges>

#include "core/clock.h"
#include "core/errno_text.h"

namespace crescent::bench {

Result<int> ChildProcesses::start(const std::string& name, const std::string& binary,
                                  std::vector<std::string> args, const std::string& log_path) {
  args.insert(args.begin(), binary);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return internal_error("cannot open " + log_path + ": " + errno_text(errno));
  }
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();
  std::lock_guard<std::mutex> lock(mu_);
  pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec: this process has threads.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
      ::_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (null_fd >= 0) {
      ::dup2(null_fd, 0);
    }
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int err = errno;
  ::close(log_fd);
  if (null_fd >= 0) {
    ::close(null_fd);
  }
  if (pid < 0) {
    return internal_error("fork for " + name + ": " + errno_text(err));
  }
  children_.push_back({name, log_path, pid, -1});
  return static_cast<int>(children_.size()) - 1;
}

bool ChildProcesses::is_running(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  return is_running_locked(children_[static_cast<size_t>(i)]);
}

std::string ChildProcesses::describe_exit(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  const Child& c = children_[static_cast<size_t>(i)];
  return c.exit_code >= 128 ? "killed by signal " + std::to_string(c.exit_code - 128)
                            : "exit code " + std::to_string(c.exit_code);
}

pid_t ChildProcesses::pid(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  return children_[static_cast<size_t>(i)].pid;
}

const std::string& ChildProcesses::log_path(int i) const {
  // log_path never changes after start(), and start() runs on the owning thread.
  return children_[static_cast<size_t>(i)].log_path;
}

void ChildProcesses::signal_all(int sig) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Child& c : children_) {
    if (is_running_locked(c)) {
      ::kill(c.pid, sig);
    }
  }
}

void ChildProcesses::stop_all(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Child& c : children_ | std::views::reverse) {
      if (is_running_locked(c)) {
        ::kill(c.pid, SIGTERM);
      }
    }
  }
  Deadline deadline = Deadline::after(grace);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool any = false;
      for (Child& c : children_) {
        any = is_running_locked(c) || any;
      }
      if (!any) {
        return;
      }
      if (deadline.is_expired()) {
        for (Child& c : children_) {
          if (is_running_locked(c)) {
            std::fprintf(stderr, "bench disagg: %s did not stop in time, SIGKILL\n",
                         c.name.c_str());
            ::kill(c.pid, SIGKILL);
            int status = 0;
            ::waitpid(c.pid, &status, 0);
            c.pid = -1;
            c.exit_code = 128 + SIGKILL;
          }
        }
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool ChildProcesses::is_running_locked(Child& c) {
  if (c.pid <= 0) {
    return false;
  }
  int status = 0;
  if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    c.pid = -1;
    return false;
  }
  return true;
}

InterruptWatcher::InterruptWatcher(ChildProcesses* children) : children_(children) {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, &old_mask_);
  thread_ = std::thread([this] { watch(); });
}

InterruptWatcher::~InterruptWatcher() {
  is_done_.store(true);
  thread_.join();
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

void InterruptWatcher::watch() {
  thread_id_.store(static_cast<pid_t>(::gettid()));
  timespec tick{0, 100'000'000};
  while (!is_done_.load()) {
    int sig = sigtimedwait(&signals_, nullptr, &tick);
    if (sig > 0 && !is_interrupted_.exchange(true)) {
      std::fprintf(stderr, "\nbench disagg: %s, stopping the deployment\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      children_->signal_all(SIGTERM);
    }
  }
}

}  // namespace crescent::bench
