// `crescent bench disagg` and `crescent bench disagg --encode`: flag parsing only. The
// benchmarks live in src/bench/disagg (pd_bench.h: the P/D TTFT breakdown on a deployment it
// starts; ec_bench.h: the EC transfer of image embeddings against memcpy).

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "bench/disagg/ec_bench.h"
#include "bench/disagg/pd_bench.h"

namespace crescent::apps {
namespace {

int bench_disagg_encode(const std::vector<std::string>& args) {
  bench::EcBenchOptions o;
  FlagParser flags(
      "crescent bench disagg --encode [--ec-transport shm|tcp|ucx] [--tokens 256,1196] "
      "[--hidden-size 1536] [--num-images 50] [--json FILE]",
      "The encoder split of EPD: one image's embeddings (--tokens x --hidden-size float32,\n"
      "Qwen2-VL-2B's shapes by default) published into an EC producer's pool and fetched by\n"
      "an EC consumer (each with its own transfer engine, in this process), --num-images\n"
      "times per shape after --warmup images; per-image fetch latency (p50, p99, best), GB/s,\n"
      "and its ratio to a memcpy of the same bytes timed in the same run (target for shm:\n"
      "fetch <= 2x memcpy, on medians). Every fetched float is checked. For the encode, pull\n"
      "and prefill times of real image requests, see `scripts/demo.sh epd` and\n"
      "docs/epd_benchmark.md.");
  flags.add("ec-transport", &o.ec_transport, "shm, tcp or ucx");
  flags.add("tokens", &o.tokens, "image sizes, in embedding rows (merged tokens), comma-separated");
  flags.add("hidden-size", &o.hidden_size, "floats per embedding row");
  flags.add("num-images", &o.num_images, "measured images per shape");
  flags.add("warmup", &o.num_warmup, "images per shape before measuring (the first connects)");
  flags.add("target-ratio", &o.target_ratio, "shm target for fetch / memcpy (medians)");
  flags.add("json", &o.json_path, "also write the figures to this JSON file");
  if (int rc = flags.parse_or_exit_code(args); rc >= 0) {
    return rc;
  }
  if (Status s = bench::validate_ec_bench_options(o); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = bench::run_ec_bench(o); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

int bench_disagg(const std::vector<std::string>& args) {
  // The encoder split (EPD) has flags of its own: bench/disagg/ec_bench.h.
  if (auto it = std::find(args.begin(), args.end(), "--encode"); it != args.end()) {
    std::vector<std::string> rest(args.begin(), it);
    rest.insert(rest.end(), it + 1, args.end());
    return bench_disagg_encode(rest);
  }
  bench::PdBenchOptions o;
  int64_t seed = 0;
  FlagParser flags(
      "crescent bench disagg --model DIR [--kv-transport shm|tcp|ucx] [--num-requests 5] "
      "[--prompt-len 1024] [--output-len 4] [--json FILE]",
      "Starts a prefill server (hosting the bootstrap server), a decode server and a proxy from\n"
      "this binary on free 127.0.0.1 ports, sends one warm-up and then --num-requests streamed\n"
      "completions one at a time (random token-id prompts, temperature 0) through the proxy,\n"
      "and splits each time to first token into proxy, bootstrap lookup, wait (the prefill\n"
      "server's queue + prefill), KV transfer, decode-side recompute and other, from the\n"
      "servers' /metrics. The transfer is compared with a memcpy of the same bytes timed in\n"
      "this process in the same run (target for shm: transfer <= 2x memcpy). The children are\n"
      "always stopped; their logs stay in --log-dir. See docs/disagg_benchmark.md.\n"
      "With --encode: the EPD encoder split instead (EC transfer of image embeddings vs\n"
      "memcpy; `crescent bench disagg --encode --help`, docs/epd_benchmark.md).");
  flags.add("model", &o.model, "model directory (with tokenizer.json)");
  flags.add("kv-transport", &o.kv_transport, "shm, tcp or ucx");
  flags.add("num-requests", &o.num_requests, "measured requests (after one warm-up)");
  flags.add("prompt-len", &o.prompt_len, "prompt tokens per request");
  flags.add("output-len", &o.output_len, "output tokens per request");
  flags.add("prefill-threads", &o.prefill_threads,
            "compute threads of the prefill server (0: half the cores)");
  flags.add("decode-threads", &o.decode_threads,
            "compute threads of the decode server (0: the other cores)");
  flags.add("kv-cache-mb", &o.kv_cache_mb, "KV cache of each server, MiB");
  flags.add("kv-cache-dtype", &o.kv_cache_dtype,
            "the servers' --kv-cache-dtype: auto, float32, bf16, f16, fp8_e4m3 or q8_0 (bf16 "
            "moves half the bytes of float32)");
  flags.add("kv-transfer-timeout", &o.kv_transfer_timeout_s,
            "the servers' --kv-transfer-timeout (it covers the prefill), seconds");
  flags.add("request-timeout", &o.request_timeout_s, "bound on each request, seconds");
  flags.add("startup-timeout", &o.startup_timeout_s,
            "bound on starting the three processes, seconds");
  flags.add("memcpy-reps", &o.memcpy_reps,
            "timed memcpys of each kind after each measured request");
  flags.add("target-ratio", &o.target_ratio, "shm target for transfer / memcpy");
  flags.add("seed", &seed, "seed of the random prompts");
  flags.add("log-dir", &o.log_dir,
            "where the children's logs go (default: a new /tmp/crescent-bench-disagg-*)");
  flags.add("json", &o.json_path, "also write the figures to this JSON file");
  if (int rc = flags.parse_or_exit_code(args); rc >= 0) {
    return rc;
  }
  o.seed = static_cast<uint64_t>(seed);
  if (Status s = bench::validate_pd_bench_options(o); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  const std::string binary = std::filesystem::read_symlink("/proc/self/exe").string();
  const bench::PdBenchOutcome outcome = bench::run_pd_bench(o, binary);
  if (outcome.is_interrupted) {
    std::fprintf(stderr, "bench disagg: interrupted; logs in %s\n", o.log_dir.c_str());
    return 130;
  }
  if (!outcome.status.is_ok()) {
    std::fprintf(stderr, "error: %s\n(logs in %s)\n", outcome.status.to_string().c_str(),
                 o.log_dir.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace crescent::apps

CRESCENT_REGISTER_COMMAND(bench_disagg, "bench disagg",
                          "TTFT breakdown of prefill/decode disaggregation vs a memcpy baseline",
                          crescent::apps::bench_disagg)
