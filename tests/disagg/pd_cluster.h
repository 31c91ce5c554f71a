#pragma once
// The processes of a disaggregated deployment on 127.0.0.1, started from the real `crescent`
// binary on the tiny test model: `serve --role both|prefill|decode`, `proxy` and `bootstrap`.
// Every start waits (with a deadline) until the process answers /health 200, and returns an
// error carrying the process's output otherwise. Ports are free ports picked at start.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "testing/child_process.h"

namespace crescent::testing {

// The model name every server in these tests reports ("tiny").
inline constexpr const char* kModelName = "tiny";

// A free TCP port on 127.0.0.1 (bound to port 0, read, closed). Another process can take it
// in between: callers that need a fixed number accept that small race.
int free_port();

// How long a process may take to start (scaled up under sanitizers).
int start_timeout_s();

// Multiplies counts (prompts, rounds) for the build type and CRESCENT_TEST_SCALE: 1 in
// release, smaller under ASan/TSan; CRESCENT_TEST_SCALE=F (0 < F <= 4) overrides.
double test_scale();
int scaled(int n, int minimum = 1);
// ms scaled up as test_scale() scales counts down: how long a slower step may take.
int64_t slack_ms(double ms);
double seconds_since(std::chrono::steady_clock::time_point t);

struct ServeSpec {
  std::string role = "both";          // both | prefill | decode
  int port = 0;                       // HTTP port (0: any free port)
  std::string model_preset = "tiny";  // `crescent make-model --preset` of the served model
  int model_seed = 0;                 // its --seed: another seed, another checkpoint
  std::string transport = "tcp";
  double kv_transfer_timeout_s = 3;
  int bootstrap_port = 0;      // prefill: where it hosts the bootstrap server (0: pick one)
  std::string bootstrap_addr;  // prefill: use this external bootstrap instead of hosting one
  int block_size = 16;
  int kv_cache_mb = 32;
  int max_model_len = 1024;
  std::vector<std::string> extra_args;
};

// One running HTTP process (serve or proxy).
struct Node {
  std::unique_ptr<ChildProcess> process;
  int port = 0;
  int bootstrap_port = 0;  // prefill nodes that host one; 0 otherwise

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  std::string bootstrap_url() const { return "http://127.0.0.1:" + std::to_string(bootstrap_port); }
  std::string output() const { return process ? process->output() : std::string(); }
};

// The command line of `crescent serve` for spec (without the binary), bootstrap port filled.
std::vector<std::string> serve_args(ServeSpec* spec);

// Starts the process but does not wait for it (start several, then wait for each).
Result<Node> launch_serve(const std::string& name, ServeSpec spec);
// Waits for the port and /health 200 (prefill with a hosted bootstrap: its /query too).
Status wait_ready(Node* node, bool wait_bootstrap = false);
// launch_serve + wait_ready.
Result<Node> start_serve(const std::string& name, ServeSpec spec);

// `crescent proxy --prefill P.url B --decode D.url`, ready (/health 200).
Result<Node> start_proxy(const Node& prefill, const Node& decode,
                         std::vector<std::string> extra_args = {});
// `crescent proxy --host 127.0.0.1 --port 0 ARGS...`, ready (/health 200); the error carries
// the proxy's output.
Result<Node> start_proxy_with(std::vector<std::string> args);
// `crescent bootstrap --port B`, ready (GET /health 200). port 0: pick one.
Result<Node> start_bootstrap(int port, int expected_dp_ranks = 1);

// A prefill + decode pair (+ proxy when asked), all ready.
struct PdPair {
  Node prefill;
  Node decode;
  Node proxy;             // empty unless with_proxy
  std::string engine_id;  // dp rank 0 of the prefill's bootstrap
  std::string outputs() const;
  // SIGTERMs every process still running (at once) and returns "" when each exited 0 within
  // timeout_s, else what went wrong; a process that had died on its own (not killed by the test)
  // and a sanitizer report in any process's output are reported too.
  std::string stop_all(int timeout_s = 30);
};
Result<PdPair> start_pd(const ServeSpec& prefill_spec, const ServeSpec& decode_spec,
                        bool with_proxy);

}  // namespace crescent::testing
