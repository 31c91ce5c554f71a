#include "disagg/pd_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "disagg/pd_client.h"
#include "testing/test_models.h"
#include "tests/testing/free_port.h"

namespace crescent::testing {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::string fmt_seconds(double s) {
  std::string out = std::to_string(s);
  out.erase(out.find_last_not_of('0') + 1);
  if (!out.empty() && out.back() == '.') {
    out.pop_back();
  }
  return out;
}

}  // namespace

int free_port() {
  return pick_free_port();
}

int start_timeout_s() {
  return kSanitized ? 120 : 60;
}

double test_scale() {
  if (const char* s = std::getenv("CRESCENT_TEST_SCALE"); s != nullptr && *s != '\0') {
    double v = std::atof(s);
    if (v > 0 && v <= 4) {
      return v;
    }
  }
  return kSanitized ? 0.25 : 1.0;
}

int scaled(int n, int minimum) {
  return std::max(minimum, static_cast<int>(std::lround(n * test_scale())));
}

int64_t slack_ms(double ms) {
  return static_cast<int64_t>(ms / std::min(1.0, test_scale()));
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::vector<std::string> serve_args(ServeSpec* spec) {
  std::vector<std::string> args = {"serve",
                                   "--model",
                                   ensure_test_model(spec->model_preset, spec->model_seed),
                                   "--served-model-name",
                                   kModelName,
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(spec->port),
                                   "--threads",
                                   "1",
                                   "--io-threads",
                                   "1",
                                   "--max-model-len",
                                   std::to_string(spec->max_model_len),
                                   "--kv-cache-mb",
                                   std::to_string(spec->kv_cache_mb),
                                   "--block-size",
                                   std::to_string(spec->block_size),
                                   "--role",
                                   spec->role};
  if (spec->role != "both") {
    args.insert(args.end(), {"--kv-transport", spec->transport, "--kv-transfer-timeout",
                             fmt_seconds(spec->kv_transfer_timeout_s)});
  }
  if (spec->role == "prefill") {
    if (!spec->bootstrap_addr.empty()) {
      args.insert(args.end(), {"--bootstrap-addr", spec->bootstrap_addr});
    } else {
      if (spec->bootstrap_port == 0) {
        spec->bootstrap_port = free_port();
      }
      args.insert(args.end(), {"--bootstrap-port", std::to_string(spec->bootstrap_port)});
    }
  }
  args.insert(args.end(), spec->extra_args.begin(), spec->extra_args.end());
  return args;
}

Result<Node> launch_serve(const std::string& name, ServeSpec spec) {
  std::vector<std::string> args = serve_args(&spec);
  ASSIGN_OR_RETURN(auto process, ChildProcess::start(name, args));
  Node node;
  node.process = std::move(process);
  if (spec.role == "prefill" && spec.bootstrap_addr.empty()) {
    node.bootstrap_port = spec.bootstrap_port;
  }
  return node;
}

Status wait_ready(Node* node, bool wait_bootstrap) {
  auto deadline = Deadline::after(std::chrono::seconds(start_timeout_s()));
  ASSIGN_OR_RETURN(node->port, node->process->wait_for_port(deadline));
  RETURN_IF_ERROR(node->process->wait_healthy(node->port, deadline));
  if (wait_bootstrap && node->bootstrap_port != 0) {
    RETURN_IF_ERROR(node->process->wait_healthy(node->bootstrap_port, deadline, "/query"));
  }
  return Status::ok();
}

namespace {

// A bootstrap port that free_port() picked can be taken by another test's process before the
// prefill server binds it (ctest runs tests in parallel): the server then exits saying
// "Address already in use". Such a prefill is started again on another port (3 tries).
bool picks_its_bootstrap_port(const ServeSpec& spec) {
  return spec.role == "prefill" && spec.bootstrap_addr.empty() && spec.bootstrap_port == 0;
}

bool lost_its_port(const Node& node, const Status& why) {
  constexpr std::string_view kInUse = "Address already in use";
  return why.message().find(kInUse) != std::string::npos ||
         node.output().find(kInUse) != std::string::npos;
}

// Waits for a launched node; a prefill that lost its picked bootstrap port is launched again.
Status wait_ready_or_relaunch(const std::string& name, const ServeSpec& spec, Node* node) {
  const bool prefill = spec.role == "prefill";
  for (int attempt = 1;; ++attempt) {
    Status ready = wait_ready(node, prefill);
    if (ready.is_ok() || !picks_its_bootstrap_port(spec) || attempt == 3 ||
        !lost_its_port(*node, ready)) {
      return ready;
    }
    ASSIGN_OR_RETURN(*node, launch_serve(name, spec));
  }
}

}  // namespace

Result<Node> start_serve(const std::string& name, ServeSpec spec) {
  ASSIGN_OR_RETURN(Node node, launch_serve(name, spec));
  RETURN_IF_ERROR(wait_ready_or_relaunch(name, spec, &node));
  return node;
}

Result<Node> start_proxy(const Node& prefill, const Node& decode,
                         std::vector<std::string> extra_args) {
  std::vector<std::string> args = {
      "--prefill", prefill.url(), std::to_string(prefill.bootstrap_port), "--decode", decode.url()};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  return start_proxy_with(std::move(args));
}

Result<Node> start_proxy_with(std::vector<std::string> args) {
  args.insert(args.begin(), {"proxy", "--host", "127.0.0.1", "--port", "0"});
  ASSIGN_OR_RETURN(auto process, ChildProcess::start("proxy", args));
  Node node;
  node.process = std::move(process);
  auto deadline = Deadline::after(std::chrono::seconds(start_timeout_s()));
  ASSIGN_OR_RETURN(node.port, node.process->wait_for_port(deadline));
  Status healthy = node.process->wait_healthy(node.port, deadline);
  if (!healthy.is_ok()) {
    return Status(healthy.code(), healthy.message() + "; proxy output:\n" + node.output());
  }
  return node;
}

Result<Node> start_bootstrap(int port, int expected_dp_ranks) {
  if (port == 0) {
    port = free_port();
  }
  ASSIGN_OR_RETURN(auto process,
                   ChildProcess::start("bootstrap", {"bootstrap", "--host", "127.0.0.1", "--port",
                                                     std::to_string(port), "--expected-dp-ranks",
                                                     std::to_string(expected_dp_ranks)}));
  Node node;
  node.process = std::move(process);
  node.port = port;
  node.bootstrap_port = port;
  auto deadline = Deadline::after(std::chrono::seconds(start_timeout_s()));
  RETURN_IF_ERROR(node.process->wait_healthy(port, deadline));
  return node;
}

std::string PdPair::outputs() const {
  return prefill.output() + decode.output() + proxy.output();
}

std::string PdPair::stop_all(int timeout_s) {
  std::string problems;
  const std::vector<std::pair<const char*, Node*>> nodes = {
      {"proxy", &proxy}, {"decode", &decode}, {"prefill", &prefill}};
  for (auto& [name, node] : nodes) {
    if (!node->process) {
      continue;
    }
    if (!node->process->is_running()) {
      if (!node->process->was_killed()) {
        problems += std::string(name) + " had exited by itself with code " +
                    std::to_string(node->process->exit_code()) + "; ";
      }
      continue;
    }
    node->process->signal(SIGTERM);
  }
  auto deadline = Deadline::after(std::chrono::seconds(timeout_s));
  for (auto& [name, node] : nodes) {
    if (!node->process || node->process->was_killed() || node->process->exit_code() >= 0) {
      continue;
    }
    int code = node->process->wait_exit(deadline);
    if (code != 0) {
      problems += std::string(name) +
                  (code < 0 ? " did not exit on SIGTERM in time"
                            : " exited with code " + std::to_string(code)) +
                  "; ";
    }
  }
  // A sanitizer report (printed at the latest when the process exits) counts even from a
  // process the test killed.
  for (auto& [name, node] : nodes) {
    if (!node->process || node->process->is_running()) {
      continue;
    }
    node->process->wait_drained();
    std::string out = node->process->output();
    for (const char* marker : {"ERROR: AddressSanitizer", "WARNING: ThreadSanitizer",
                               "runtime error:", "ERROR: LeakSanitizer"}) {
      if (auto pos = out.find(marker); pos != std::string::npos) {
        problems += std::string(name) + " reported:\n" + out.substr(pos, 4000) + "\n";
      }
    }
  }
  return problems;
}

Result<PdPair> start_pd(const ServeSpec& prefill_spec, const ServeSpec& decode_spec,
                        bool with_proxy) {
  ServeSpec p = prefill_spec;
  p.role = "prefill";
  ServeSpec d = decode_spec;
  d.role = "decode";
  PdPair pair;
  // Both load at once; then wait for each.
  ASSIGN_OR_RETURN(pair.prefill, launch_serve("P", p));
  ASSIGN_OR_RETURN(pair.decode, launch_serve("D", d));
  RETURN_IF_ERROR(wait_ready_or_relaunch("P", p, &pair.prefill));
  RETURN_IF_ERROR(wait_ready(&pair.decode, false));
  std::string error;
  std::string bootstrap =
      pair.prefill.bootstrap_port != 0 ? pair.prefill.bootstrap_url() : prefill_spec.bootstrap_addr;
  pair.engine_id = query_engine_id(bootstrap, &error);
  if (pair.engine_id.empty()) {
    return unavailable("no engine id from the bootstrap " + bootstrap + ": " + error + "\n" +
                       pair.outputs());
  }
  if (with_proxy) {
    ASSIGN_OR_RETURN(pair.proxy, start_proxy(pair.prefill, pair.decode));
  }
  return pair;
}

}  // namespace crescent::testing
