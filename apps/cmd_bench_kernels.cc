// `crescent bench kernels`: GEMV, GEMM and prefill attention throughput of the CPU kernels against
// memcpy bandwidth and peak multiply-add rate, measured in the same run (see docs/kernels.md).

#include <cstdio>

#include "apps/command.h"
#include "apps/flags.h"
#include "kernels/kernel_bench.h"

namespace crescent::apps {
namespace {

int run_bench_kernels(const std::vector<std::string>& args) {
  kernels::KernelBenchOptions o;
  FlagParser flags(
      "crescent bench kernels [--threads N] [--tokens N] [--types LIST] [--isa NAME]",
      "GEMV GB/s vs memcpy GB/s, GEMM and prefill attention GFLOP/s vs peak, Qwen2.5-0.5B shapes.");
  flags.add("threads", &o.num_threads, "threads (the calling thread counts)");
  flags.add("tokens", &o.prefill_tokens,
            "tokens of the prefill GEMM and the shorter attention prompt (the other: 4x)");
  flags.add("reps", &o.num_reps, "timed repetitions (best is reported)");
  flags.add("stack-layers", &o.num_stack_layers, "layers in the streamed decode stack");
  flags.add("lm-head", &o.include_lm_head, "also time the 151936x896 lm_head GEMV");
  flags.add("types", &o.types,
            "weight formats to time, comma-separated: f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
            "q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl");
  flags.add("isa", &o.isa, "portable, avx2, avx512 or avx512bf16 (default: detected)");
  if (int code = flags.parse_or_exit_code(args); code >= 0)
    return code;
  Status status = kernels::run_kernel_benchmarks(o, stdout);
  if (!status.is_ok()) {
    std::fprintf(stderr, "bench kernels: %s\n", status.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_kernels, "bench kernels",
                          "kernel GEMV/GEMM/attention throughput vs memcpy and peak",
                          run_bench_kernels)

}  // namespace crescent::apps
