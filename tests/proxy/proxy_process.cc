#include "proxy/proxy_process.h"

#include <chrono>
#include <utility>

#include "testing/child_process.h"

namespace crescent::testing {

ProxyProcess::ProxyProcess(std::vector<std::string> args, int timeout_s) {
  args.insert(args.begin(), {"proxy", "--port", "0"});
  child_ = start_or_abort("proxy", std::move(args));
  Result<int> port = child_->wait_for_port(Deadline::after(std::chrono::seconds(timeout_s)));
  if (!port.is_ok()) {
    abort_not_up(child_.get(), "did not listen within " + std::to_string(timeout_s) + " s");
  }
  port_ = *port;
}

ProxyProcess::~ProxyProcess() = default;

int ProxyProcess::terminate(int timeout_s) {
  return child_->terminate(Deadline::after(std::chrono::seconds(timeout_s)));
}

std::string ProxyProcess::output() {
  return child_->raw_output();
}

ExitResult run_proxy_to_exit(const std::vector<std::string>& args, int timeout_s) {
  std::vector<std::string> all = {"proxy"};
  all.insert(all.end(), args.begin(), args.end());
  std::unique_ptr<ChildProcess> child = start_or_abort("proxy", std::move(all));
  ExitResult result;
  result.exit_code = child->wait_exit(Deadline::after(std::chrono::seconds(timeout_s)));
  if (result.exit_code == -1) {
    child->kill_now();
    child->wait_drained();
  }
  result.output = child->raw_output();
  return result;
}

}  // namespace crescent::testing
