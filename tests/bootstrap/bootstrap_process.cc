#include "bootstrap/bootstrap_process.h"

#include <signal.h>

#include <utility>

#include "testing/child_process.h"

namespace crescent::testing {

BootstrapProcess::BootstrapProcess(std::vector<std::string> args) {
  args.insert(args.begin(), "bootstrap");
  child_ = start_or_abort("bootstrap", std::move(args));
}

BootstrapProcess::~BootstrapProcess() = default;

int BootstrapProcess::wait_for_port(int timeout_ms) {
  Result<int> port = child_->wait_for_port(Deadline::after_ms(timeout_ms));
  return port.is_ok() ? *port : 0;
}

int BootstrapProcess::wait_exit(int timeout_ms) {
  return child_->wait_exit(Deadline::after_ms(timeout_ms));
}

int BootstrapProcess::terminate(int timeout_ms) {
  child_->signal(SIGTERM);  // a no-op once it has been reaped
  return wait_exit(timeout_ms);
}

std::string BootstrapProcess::output() {
  return child_->raw_output();
}

}  // namespace crescent::testing
