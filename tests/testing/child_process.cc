#include "testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "net/http/http_client.h"
#include "testing/test_models.h"

extern char** environ;

namespace crescent::testing {

Result<std::unique_ptr<ChildProcess>> ChildProcess::start(std::string name,
                                                          std::vector<std::string> args) {
  // CRESCENT_TEST_BINARY runs the tests against another build of crescent (e.g. a mutant).
  const char* other = std::getenv("CRESCENT_TEST_BINARY");
  args.insert(args.begin(), other != nullptr && *other != '\0' ? other : crescent_binary());
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return internal_error("pipe2 failed");
  }
  // fork + exec rather than posix_spawn, for PR_SET_PDEATHSIG: a test binary that dies
  // (crash, abort, timeout kill) takes its servers with it instead of leaving them running.
  // Only async-signal-safe calls between fork and exec.
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return internal_error("fork failed for " + name);
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
      _exit(127);  // the parent died before prctl took effect
    }
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execve(argv[0], argv.data(), environ);
    // Said on the pipe, so the parent's "exited before it listened" message names the cause.
    const char kCannotExec[] = "cannot exec ";
    (void)!write(2, kCannotExec, sizeof(kCannotExec) - 1);
    (void)!write(2, argv[0], std::strlen(argv[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  close(fds[1]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(std::move(name), pid, fds[0]));
}

ChildProcess::ChildProcess(std::string name, pid_t pid, int out_fd)
    : name_(std::move(name)), pid_(pid), out_fd_(out_fd) {
  drain_thread_ = std::thread([this] { drain(); });
}

ChildProcess::~ChildProcess() {
  kill_now();
  if (drain_thread_.joinable()) {
    drain_thread_.join();
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
  }
}

void ChildProcess::drain() {
  char buf[4096];
  for (;;) {
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;  // EOF: the child (and whoever shared its pipe) is gone
    }
    std::lock_guard<std::mutex> lock(mu_);
    output_.append(buf, static_cast<size_t>(n));
  }
  std::lock_guard<std::mutex> lock(mu_);
  drained_ = true;
  drained_cv_.notify_all();
}

bool ChildProcess::wait_drained(Deadline deadline) {
  if (is_running()) {
    return false;
  }
  // The pipe reaches EOF once the child is gone, unless a process it started still holds it.
  std::unique_lock<std::mutex> lock(mu_);
  return drained_cv_.wait_until(lock, deadline.when(), [this] { return drained_; });
}

std::string ChildProcess::output() const {
  std::string raw = raw_output();
  std::string out;
  out.reserve(raw.size() + raw.size() / 16);
  bool at_line_start = true;
  for (char c : raw) {
    if (at_line_start) {
      out += "[" + name_ + "] ";
    }
    out += c;
    at_line_start = c == '\n';
  }
  return out;
}

std::string ChildProcess::raw_output() const {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

Result<int> ChildProcess::wait_for_port(Deadline deadline) {
  const std::string marker = "listening on http://";
  while (!deadline.is_expired()) {
    std::string out = raw_output();
    auto pos = out.find(marker);
    if (pos != std::string::npos) {
      auto colon = out.find(':', pos + marker.size());
      auto end =
          colon == std::string::npos ? colon : out.find_first_not_of("0123456789", colon + 1);
      if (end != std::string::npos && end > colon + 1) {
        return std::atoi(out.c_str() + colon + 1);
      }
    }
    if (!is_running()) {
      return unavailable(name_ + " exited (code " + std::to_string(exit_code_) +
                         ") before it listened:\n" + output());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return deadline_exceeded(name_ + " printed no 'listening on' line in time:\n" + output());
}

Status ChildProcess::wait_healthy(int port, Deadline deadline, const std::string& path) {
  net::http::HttpClient client("127.0.0.1", port);
  std::string last;
  while (!deadline.is_expired()) {
    auto r = client.request("GET", path, "", {}, Deadline::after_ms(2000));
    if (r.is_ok() && r->status == 200) {
      return Status::ok();
    }
    last = r.is_ok() ? std::to_string(r->status) + " " + r->body : r.status().to_string();
    if (!is_running()) {
      return unavailable(name_ + " exited (code " + std::to_string(exit_code_) + ") before " +
                         path + " answered 200:\n" + output());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return deadline_exceeded(name_ + " " + path + " not 200 in time (last: " + last + "):\n" +
                           output());
}

void ChildProcess::signal(int sig) {
  if (pid_ > 0) {
    ::kill(pid_, sig);
  }
}

bool ChildProcess::reap(bool block) {
  if (pid_ <= 0) {
    return true;
  }
  int status = 0;
  pid_t r = 0;
  do {
    r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) {
    return false;
  }
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  pid_ = -1;  // reaped (or, on ECHILD, not ours to wait for any more)
  return true;
}

bool ChildProcess::is_running() {
  return !reap(/*block=*/false);
}

int ChildProcess::wait_exit(Deadline deadline) {
  while (is_running()) {
    if (deadline.is_expired()) {
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  wait_drained();
  return exit_code_;
}

int ChildProcess::terminate(Deadline deadline) {
  if (pid_ <= 0) {
    return -1;
  }
  signal(SIGTERM);
  return wait_exit(deadline);
}

void ChildProcess::kill_now() {
  if (pid_ > 0) {
    was_killed_ = true;
    ::kill(pid_, SIGKILL);
    reap(/*block=*/true);
  }
}

std::unique_ptr<ChildProcess> start_or_abort(std::string name, std::vector<std::string> args) {
  auto child = ChildProcess::start(name, std::move(args));
  if (!child.is_ok()) {
    std::fprintf(stderr, "cannot start crescent %s: %s\n", name.c_str(),
                 child.status().to_string().c_str());
    std::abort();
  }
  return std::move(*child);
}

void abort_not_up(ChildProcess* child, const std::string& not_up) {
  child->wait_drained();
  const bool exited = !child->is_running();
  std::fprintf(stderr, "crescent %s %s:\n%s\n", child->name().c_str(),
               exited ? "exited early" : not_up.c_str(), child->raw_output().c_str());
  std::abort();
}

}  // namespace crescent::testing
