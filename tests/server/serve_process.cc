#include "server/serve_process.h"

#include <chrono>
#include <utility>

#include "testing/child_process.h"

namespace crescent::testing {

ServeProcess::ServeProcess(std::vector<std::string> extra_args, int timeout_s) {
  std::vector<std::string> args = {"serve", "--port", "0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  child_ = start_or_abort("serve", std::move(args));
  const Deadline deadline = Deadline::after(std::chrono::seconds(timeout_s));
  Result<int> port = child_->wait_for_port(deadline);
  if (!port.is_ok() || !child_->wait_healthy(*port, deadline).is_ok()) {
    abort_not_up(child_.get(), "did not become healthy in " + std::to_string(timeout_s) + " s");
  }
  port_ = *port;
}

ServeProcess::~ServeProcess() = default;

pid_t ServeProcess::pid() const {
  return child_->pid();
}

int ServeProcess::terminate(int timeout_s) {
  return child_->terminate(Deadline::after(std::chrono::seconds(timeout_s)));
}

std::string ServeProcess::output() {
  return child_->raw_output();
}

}  // namespace crescent::testing
