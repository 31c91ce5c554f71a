#pragma once
// The kernels benchmark behind `crescent bench kernels` (and the standalone kernels_bench
// binary): GEMV GB/s against memcpy GB/s, GEMM and prefill attention GFLOP/s against the peak
// multiply-add rate, on Qwen2.5-0.5B shapes, measured in one run. Prints a plain-text report to
// `out`.

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/status.h"

namespace crescent::kernels {

struct KernelBenchOptions {
  int num_threads = 2;
  int64_t prefill_tokens = 512;  // also the shorter attention prompt (the longer: 4x)
  int num_reps = 10;
  // Layers of the decode stack streamed per GEMV step (all seven projections each); enough
  // that the weights do not fit in the last-level cache.
  int num_stack_layers = 8;
  bool include_lm_head = true;
  std::string isa;  // empty: the detected ISA
  // Comma-separated weight formats (weight_format_name), in the order they are timed.
  std::string types = "bf16,q8_0,q4_k,q6_k,q5_0,iq4_nl,f32";
};

Status run_kernel_benchmarks(const KernelBenchOptions& options, FILE* out);

}  // namespace crescent::kernels
