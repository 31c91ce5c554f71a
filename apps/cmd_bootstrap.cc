// `crescent bootstrap`: a standalone bootstrap server (src/bootstrap) for deployments where no
// prefill process hosts one. Runs until SIGTERM or SIGINT, then exits 0.

#include <pthread.h>
#include <signal.h>

#include <cstdio>

#include "apps/command.h"
#include "apps/flags.h"
#include "bootstrap/bootstrap_server.h"
#include "net/auth/auth_token.h"

namespace crescent::apps {
namespace {

int run_bootstrap(const std::vector<std::string>& args) {
  bootstrap::BootstrapServerOptions options;
  FlagParser flags(
      "crescent bootstrap [--host 127.0.0.1] [--port 8998] [--expected-dp-ranks 1] "
      "[--bootstrap-lease-ttl 10] [--auth-token-file FILE]",
      "Runs the bootstrap server on its own: prefill workers POST /register their transfer\n"
      "address "
      "({\"engine_id\",\"dp_rank\",\"tp_rank\",\"pp_rank\",\"addr\":\"tcp://host:port\"}),\n"
      "decode workers and the proxy GET /query, which answers 503 until dp ranks\n"
      "0..expected-dp-ranks-1 have all registered. GET /health is 200 while the process serves.\n"
      "A registration with \"lease_ttl_s\" (crescent's workers) lapses unless renewed; one\n"
      "without (vLLM's) never does. A worker may replace a dp rank's owner that is gone (its\n"
      "lease lapsed, or nothing answers at its address); the replaced one is fenced out.\n"
      "Registrations are kept in memory only. SIGTERM or SIGINT stop it (exit 0).\n"
      "With --auth-token-file (or CRESCENT_AUTH_TOKEN) POST /register must be signed with the\n"
      "shared token (crescent serve --auth-token-file does it) or is refused 401; GET /query\n"
      "and /health stay open.\n"
      "See docs/bootstrap.md.");
  flags.add("host", &options.host, "address to listen on (0.0.0.0: every interface)");
  flags.add("port", &options.port, "port to listen on (0: any free port, printed at start)");
  flags.add("expected-dp-ranks", &options.expected_dp_ranks,
            "how many data-parallel ranks must register before /query answers (1..1024)");
  flags.add("threads", &options.threads, "HTTP I/O threads");
  flags.add("bootstrap-lease-ttl", &options.max_lease_ttl_s,
            "the longest lease granted, in seconds (0 < S <= 3600): a worker asking for more "
            "gets this and renews accordingly");
  std::string auth_token_file;
  flags.add("auth-token-file", &auth_token_file,
            "file holding the deployment's shared secret (default: $CRESCENT_AUTH_TOKEN, else "
            "none): registrations must be signed with it");
  if (int code = flags.parse_or_exit_code(args); code >= 0) {
    return code;
  }
  auto token = net::auth::load_auth_token(auth_token_file);
  if (!token.is_ok()) {
    std::fprintf(stderr, "error: %s\n", token.status().to_string().c_str());
    return 2;
  }
  options.auth_token = std::move(*token);
  // Blocked before the server's threads start, so they inherit the mask and only sigwait
  // below takes the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = bootstrap::BootstrapServer::start(options);
  if (!server.is_ok()) {
    std::fprintf(stderr, "error: %s\n", server.status().to_string().c_str());
    return 1;
  }
  std::printf("crescent bootstrap: listening on %s (expecting %d dp rank(s))\n",
              (*server)->url().c_str(), options.expected_dp_ranks);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  (*server)->stop();
  std::printf("crescent bootstrap: %s, stopped\n", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  std::fflush(stdout);
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bootstrap, "bootstrap",
                          "run a standalone bootstrap server (workers register, peers query)",
                          run_bootstrap)
}  // namespace crescent::apps
