#include "proxy/proxy_process.h"

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

// Starts `crescent proxy args...` with stdout and stderr on a pipe; returns the pid.
pid_t spawn_proxy(const std::vector<std::string>& args, int* out_fd) {
  std::vector<std::string> all = {crescent_binary(), "proxy"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) {
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
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start %s\n", argv[0]);
    std::abort();
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

// Appends what is readable on fd within timeout_ms; false at end of file.
bool drain(int fd, int timeout_ms, std::string* out) {
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, timeout_ms) > 0) {
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      return false;
    }
    out->append(buf, static_cast<size_t>(n));
    timeout_ms = 0;
  }
  return true;
}

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

ProxyProcess::ProxyProcess(std::vector<std::string> args, int timeout_s) {
  std::vector<std::string> all = {"--port", "0"};
  all.insert(all.end(), args.begin(), args.end());
  pid_ = spawn_proxy(all, &out_fd_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  const std::string marker = "listening on http://127.0.0.1:";
  while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
    drain_output(50);
    auto pos = output_.find(marker);
    if (pos != std::string::npos && output_.find(' ', pos + marker.size()) != std::string::npos) {
      port_ = std::atoi(output_.c_str() + pos + marker.size());
    }
    int status = 0;
    if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      drain_output(0);
      std::fprintf(stderr, "crescent proxy exited early:\n%s\n", output_.c_str());
      std::abort();
    }
  }
  if (port_ == 0) {
    std::fprintf(stderr, "crescent proxy did not listen within %d s:\n%s\n", timeout_s,
                 output_.c_str());
    std::abort();
  }
}

ProxyProcess::~ProxyProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
  }
}

void ProxyProcess::drain_output(int timeout_ms) {
  drain(out_fd_, timeout_ms, &output_);
}

std::string ProxyProcess::output() {
  drain_output(0);
  return output_;
}

int ProxyProcess::terminate(int timeout_s) {
  if (pid_ <= 0) {
    return -1;
  }
  kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    drain_output(20);
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      drain_output(0);
      return exit_code_of(status);
    }
  }
  return -1;
}

ExitResult run_proxy_to_exit(const std::vector<std::string>& args, int timeout_s) {
  ExitResult result;
  int fd = -1;
  pid_t pid = spawn_proxy(args, &fd);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    bool open = drain(fd, 20, &result.output);
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      drain(fd, 0, &result.output);
      result.exit_code = exit_code_of(status);
      close(fd);
      return result;
    }
    (void)open;
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fd);
  return result;
}

}  // namespace crescent::testing
