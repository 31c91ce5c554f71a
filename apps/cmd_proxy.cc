// `crescent proxy`: the OpenAI-compatible router over prefill and decode servers (and encoder
// servers for images), with the reference proxy's flags (src/proxy/proxy_options.h) and a graceful
// SIGTERM drain.

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "apps/command.h"
#include "core/clock.h"
#include "proxy/proxy_server.h"

namespace crescent::apps {
namespace {

int run_proxy(const std::vector<std::string>& args) {
  auto parsed = proxy::parse_proxy_args(args);
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "error: %s\n\n%s", parsed.status().message().c_str(),
                 proxy::proxy_help_text().c_str());
    return 2;
  }
  if (parsed->help_requested) {
    std::fputs(proxy::proxy_help_text().c_str(), stdout);
    return 0;
  }
  proxy::ProxyOptions options = parsed->options;
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr && *key != '\0') {
    options.default_authorization = std::string("Bearer ") + key;
  }
  // vLLM's VLLM_API_KEY rule: the flag wins, an empty variable is no key.
  for (auto [variable, key] : {std::pair{"CRESCENT_API_KEY", &options.api_key},
                               std::pair{"CRESCENT_UPSTREAM_API_KEY", &options.upstream_api_key}}) {
    const char* value = std::getenv(variable);
    if (key->empty() && value != nullptr && *value != '\0') {
      *key = value;
    }
  }
  // Every thread started from here on inherits the mask; the main thread takes the signals
  // with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto proxy_or = proxy::ProxyServer::start(options);
  if (!proxy_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", proxy_or.status().to_string().c_str());
    return 1;
  }
  auto& proxy = *proxy_or;
  std::string pools = options.pds.empty() ? std::to_string(options.prefills.size()) + " prefill, " +
                                                std::to_string(options.decodes.size()) + " decode"
                                          : std::to_string(options.pds.size()) + " pd";
  if (!options.encoders.empty()) {
    pools += ", " + std::to_string(options.encoders.size()) + " encode";
  }
  std::printf("crescent proxy: listening on http://%s:%d (%s)\n", options.host.c_str(),
              proxy->port(), pools.c_str());
  // Whether keys are in use, never the keys.
  std::printf(
      "crescent proxy: API key %s, upstream API key %s\n",
      options.api_key.empty() ? "off" : "required (open: /health, /metrics, /version, /ping)",
      options.upstream_api_key.empty() ? "off (the client's header is passed on)" : "set");
  for (const auto& p : options.prefills) {
    std::printf("crescent proxy: prefill %s, bootstrap %s\n", p.server.url.c_str(),
                p.bootstrap_addr().c_str());
  }
  for (const auto& d : options.decodes) {
    std::printf("crescent proxy: decode %s\n", d.url.c_str());
  }
  for (const auto& pd : options.pds) {
    std::printf("crescent proxy: pd %s (prefill and decode)\n", pd.url.c_str());
  }
  for (const auto& e : options.encoders) {
    std::printf("crescent proxy: encode %s (timeout %g s)\n", e.url.c_str(),
                options.encode_timeout_s);
  }
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::printf("crescent proxy: %s, draining %d request(s)\n",
              signal_number == SIGTERM ? "SIGTERM" : "SIGINT", proxy->num_in_flight());
  std::fflush(stdout);
  proxy->stop_accepting();
  auto deadline = Deadline::after(std::chrono::milliseconds(
      static_cast<int64_t>(std::max(0.0, options.drain_timeout_s) * 1000)));
  while (proxy->num_in_flight() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int num_left = proxy->num_in_flight();
  proxy->stop();
  std::printf("crescent proxy: stopped (%d request(s) cut off)\n", num_left);
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(proxy, "proxy",
                          "route OpenAI requests to prefill + decode servers (disaggregated)",
                          run_proxy)

}  // namespace crescent::apps
