// Standalone kernels benchmark (the same report as `crescent bench kernels`), for building
// and running without the rest of the crescent binary.
// usage: kernels_bench [threads] [prefill_tokens] [isa]

#include <cstdio>
#include <cstdlib>

#include "kernels/kernel_bench.h"

int main(int argc, char** argv) {
  crescent::kernels::KernelBenchOptions options;
  if (argc > 1)
    options.num_threads = std::atoi(argv[1]);
  if (argc > 2)
    options.prefill_tokens = std::atoll(argv[2]);
  if (argc > 3)
    options.isa = argv[3];
  crescent::Status status = crescent::kernels::run_kernel_benchmarks(options, stdout);
  if (!status.is_ok()) {
    std::fprintf(stderr, "%s\n", status.to_string().c_str());
    return 1;
  }
  return 0;
}
