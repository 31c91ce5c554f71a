#pragma once
// A real etcd (tools/etcd/etcd, extracted by scripts/setup.sh from Debian's etcd-server, or
// $CRESCENT_ETCD_BINARY) as a child process of a test: one member on 127.0.0.1 with free client
// and peer ports and a data dir in a fresh temp dir. start() fails (it never skips) when the
// binary is missing. The destructor SIGKILLs it and removes the data dir.

#include <sys/types.h>

#include <memory>
#include <string>

#include "core/status.h"

namespace crescent::testing {

class EtcdProcess {
 public:
  // Starts etcd and waits (up to 20 s) until its /health answers.
  static Result<std::unique_ptr<EtcdProcess>> start();
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  int client_port() const { return client_port_; }
  // "etcd://127.0.0.1:PORT" + prefix (e.g. "/test").
  std::string url(const std::string& prefix = "") const;
  // SIGKILL and reap (for "etcd is down" cases); idempotent.
  void kill_now();
  // What etcd wrote (for failure messages).
  std::string log() const;

 private:
  EtcdProcess() = default;
  pid_t pid_ = -1;
  int client_port_ = 0;
  std::string dir_;
};

}  // namespace crescent::testing
