#include "server/serve_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "net/http/http_client.h"
#include "testing/test_models.h"

extern char** environ;

namespace crescent::testing {

ServeProcess::ServeProcess(std::vector<std::string> extra_args, int timeout_s) {
  std::vector<std::string> args = {crescent_binary(), "serve", "--port", "0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
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
  if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start %s\n", argv[0]);
    std::abort();
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  out_fd_ = fds[0];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  const std::string marker = "listening on http://127.0.0.1:";
  while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
    drain_output(100);
    auto pos = output_.find(marker);
    if (pos != std::string::npos && output_.find(' ', pos + marker.size()) != std::string::npos) {
      port_ = std::atoi(output_.c_str() + pos + marker.size());
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      std::fprintf(stderr, "crescent serve exited early:\n%s\n", output_.c_str());
      pid_ = -1;
      std::abort();
    }
  }
  net::http::HttpClient client("127.0.0.1", port_);
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = client.request("GET", "/health", "", {}, Deadline::after_ms(2000));
    if (r.is_ok() && r->status == 200) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  drain_output(0);
  std::fprintf(stderr, "crescent serve did not become healthy in %d s:\n%s\n", timeout_s,
               output_.c_str());
  std::abort();
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
  }
}

void ServeProcess::drain_output(int timeout_ms) {
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

std::string ServeProcess::output() {
  drain_output(0);
  return output_;
}

int ServeProcess::terminate(int timeout_s) {
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
      if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
      }
      return 128 + WTERMSIG(status);
    }
  }
  return -1;
}

}  // namespace crescent::testing
