#include "tests/testing/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "net/http/http_client.h"
#include "tests/testing/free_port.h"

namespace crescent::testing {
namespace {

std::string etcd_binary() {
  if (const char* env = std::getenv("CRESCENT_ETCD_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return std::string(CRESCENT_SOURCE_DIR) + "/tools/etcd/etcd";
}

// A port nothing listens on now (bound to 0, read, closed).
int free_port() {
  return pick_free_port();
}

pid_t spawn(const std::vector<std::string>& args, const std::string& log_path) {
  // Everything the child needs is built before fork(): between fork and exec a child of a
  // threaded process may only make async-signal-safe calls (no malloc).
  std::vector<char*> argv;
  for (const std::string& a : args) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);
  const char* log = log_path.c_str();
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid != 0) {
    return pid;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) {
    ::_exit(127);
  }
  int fd = ::open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

}  // namespace

Result<std::unique_ptr<EtcdProcess>> EtcdProcess::start() {
  const std::string binary = etcd_binary();
  if (::access(binary.c_str(), X_OK) != 0) {
    return not_found("no etcd binary at " + binary +
                     " (scripts/setup.sh extracts it; or set CRESCENT_ETCD_BINARY)");
  }
  std::string last;
  // Another process may take a free port between the pick and etcd's bind: try a few times.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
    char dir_template[] = "/tmp/crescent-etcd-XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) {
      return internal_error("mkdtemp failed");
    }
    etcd->dir_ = dir_template;
    etcd->client_port_ = free_port();
    int peer_port = free_port();
    const std::string client = "http://127.0.0.1:" + std::to_string(etcd->client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    etcd->pid_ = spawn({binary, "--name", "test", "--data-dir", etcd->dir_ + "/data",
                        "--listen-client-urls", client, "--advertise-client-urls", client,
                        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                        "--initial-cluster", "test=" + peer, "--log-level", "warn"},
                       etcd->dir_ + "/log");
    auto deadline = Deadline::after_ms(20'000);
    net::http::HttpClient http("127.0.0.1", etcd->client_port_);
    while (!deadline.is_expired()) {
      int wstatus = 0;
      if (::waitpid(etcd->pid_, &wstatus, WNOHANG) == etcd->pid_) {
        etcd->pid_ = -1;
        break;
      }
      auto health = http.request("GET", "/health", "", {}, Deadline::after_ms(1000));
      if (health.is_ok() && health->status == 200) {
        return etcd;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    last = etcd->log();
  }
  return unavailable("etcd did not come up in 3 tries; its log: " + last);
}

EtcdProcess::~EtcdProcess() {
  kill_now();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string EtcdProcess::url(const std::string& prefix) const {
  return "etcd://127.0.0.1:" + std::to_string(client_port_) + prefix;
}

void EtcdProcess::kill_now() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

std::string EtcdProcess::log() const {
  std::ifstream in(dir_ + "/log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace crescent::testing
