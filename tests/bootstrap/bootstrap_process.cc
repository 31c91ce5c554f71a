#include "bootstrap/bootstrap_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "testing/test_models.h"

extern char** environ;

namespace crescent::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

}  // namespace

BootstrapProcess::BootstrapProcess(std::vector<std::string> args) {
  args.insert(args.begin(), {crescent_binary(), "bootstrap"});
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::abort();
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    std::fprintf(stderr, "cannot start %s\n", argv[0]);
    std::abort();
  }
  out_fd_ = fds[0];
}

BootstrapProcess::~BootstrapProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
  }
}

void BootstrapProcess::drain_output(int timeout_ms) {
  pollfd p{out_fd_, POLLIN, 0};
  while (poll(&p, 1, timeout_ms) > 0) {
    char buf[4096];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      break;
    }
    output_.append(buf, static_cast<size_t>(n));
    timeout_ms = 0;
  }
}

std::string BootstrapProcess::output() {
  drain_output(0);
  return output_;
}

bool BootstrapProcess::has_exited() {
  if (pid_ <= 0) {
    return true;
  }
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) {
    return false;
  }
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

int BootstrapProcess::wait_for_port(int timeout_ms) {
  const std::string marker = "listening on http://";
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  while (SteadyClock::now() < deadline) {
    drain_output(20);
    auto pos = output_.find(marker);
    auto end = pos == std::string::npos ? pos : output_.find(' ', pos + marker.size());
    if (end != std::string::npos) {
      auto colon = output_.rfind(':', end);
      return std::atoi(output_.c_str() + colon + 1);
    }
    if (has_exited()) {
      drain_output(0);
      return 0;
    }
  }
  return 0;
}

int BootstrapProcess::wait_exit(int timeout_ms) {
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  while (!has_exited()) {
    if (SteadyClock::now() >= deadline) {
      return -1;
    }
    drain_output(20);
  }
  drain_output(0);
  return exit_code_;
}

int BootstrapProcess::terminate(int timeout_ms) {
  if (!has_exited()) {
    kill(pid_, SIGTERM);
  }
  return wait_exit(timeout_ms);
}

}  // namespace crescent::testing
