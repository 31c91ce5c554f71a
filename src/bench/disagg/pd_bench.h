#pragma once
// `crescent bench disagg`: time to first token of prefill/decode disaggregation split into its
// phases, on a deployment the benchmark starts itself (a bootstrap-hosting prefill server, a
// decode server and a proxy, all children running the crescent binary on free 127.0.0.1
// ports). Requests go one at a time through the proxy; each phase is read from the servers'
// /metrics deltas around the request (so the figures are the servers' own clocks), and the KV
// transfer is set against a memcpy of the same bytes timed in this process during the same
// run. See docs/disagg_benchmark.md.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/disagg/copy_baseline.h"
#include "core/status.h"

namespace crescent::bench {

struct PdBenchOptions {
  std::string model;
  std::string kv_transport = "shm";
  int num_requests = 5;
  int prompt_len = 1024;
  int output_len = 4;
  int prefill_threads = 0;  // 0: half the cores
  int decode_threads = 0;   // 0: the other half
  int64_t kv_cache_mb = 1024;
  std::string kv_cache_dtype = "auto";
  double kv_transfer_timeout_s = 300;
  double request_timeout_s = 300;
  double startup_timeout_s = 300;
  int memcpy_reps = 3;  // per kind, after each measured request
  double target_ratio = 2.0;
  uint64_t seed = 0;
  std::string log_dir;    // "" -> a new /tmp/crescent-bench-disagg-*
  std::string json_path;  // "" -> no JSON
};

// Refuses out-of-range options with the flag's name; makes `model` absolute and creates
// `log_dir` (a new temporary directory when empty).
Status validate_pd_bench_options(PdBenchOptions& o);

// One request's figures, in seconds (bytes, faults and tokens as counts).
struct PdRequestFigures {
  bool is_warmup = false;
  double client_ttft_s = 0;
  double e2e_s = 0;
  int num_chunks = 0;
  double d_ttft_s = 0;     // decode server: arrival -> first token
  double proxy_s = 0;      // client TTFT - D's TTFT
  double bootstrap_s = 0;  // D: bootstrap lookup (0 when cached)
  double wait_s = 0;       // D: ASK sent -> P starts writing (P's queue + prefill)
  double transfer_s = 0;   // P's write, as reported in DONE
  double fetch_s = 0;      // D: the whole fetch
  double recompute_s = 0;  // D's TTFT - fetch: last prompt token + first sample (+ D's own
                           // queueing before the fetch)
  double other_s = 0;      // fetch - bootstrap - wait - transfer: connect, ASK/DONE delivery
  double d_tpot_s = 0;     // decode server: mean time per output token (one decode step)
  double p_ttft_s = 0;     // prefill server: arrival -> its one token (queue + prefill)
  double p_write_s = 0;    // P's own write histogram (same clock as transfer_s)
  double num_bytes = 0;
  double d_prefix_hit_tokens = 0;
  double p_prefix_hit_tokens = 0;
  int64_t p_minor_faults = -1;
  int64_t d_minor_faults = -1;
};

// Everything the report is made of.
struct PdBenchResult {
  int num_cores = 1;
  int num_prefill_threads = 1;
  int num_decode_threads = 1;
  std::string load_at_start;
  std::string load_at_end;
  std::vector<PdRequestFigures> figures;  // warm-up first
  std::map<CopyKind, std::vector<double>> copy_s;
  uint64_t num_bytes = 0;  // KV bytes of each request
};

struct PdBenchOutcome {
  Status status;
  bool is_interrupted = false;  // SIGINT/SIGTERM stopped it (status says so too)
};

// Runs the benchmark with validated options: progress and the report on stdout, the JSON when
// asked. `binary` is the crescent executable the children run. The children are stopped
// before it returns, whatever happened; their logs stay in o.log_dir.
PdBenchOutcome run_pd_bench(const PdBenchOptions& o, const std::string& binary);

}  // namespace crescent::bench
