#include "kernels/baselines.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/aligned_buffer.h"
#include "kernels/kernel_table.h"
#include "kernels/weight_memory.h"

namespace crescent::kernels {
namespace {

using Clock = std::chrono::steady_clock;

int64_t round_up_4k(int64_t n) {
  return (n + 4095) / 4096 * 4096;
}

}  // namespace

double measure_memcpy_gbps(ThreadPool& pool, int64_t num_bytes) {
  num_bytes = std::max<int64_t>(num_bytes / 4096 * 4096, 4096);
  std::unique_ptr<char, FreeDeleter> src(static_cast<char*>(std::aligned_alloc(4096, num_bytes)));
  std::unique_ptr<char, FreeDeleter> dst(static_cast<char*>(std::aligned_alloc(4096, num_bytes)));
  CRESCENT_CHECK(src && dst) << "out of memory for the memcpy baseline";
  const int n = pool.num_threads();
  // First touch by the thread that later copies each part.
  pool.parallel_for(n, [&](int c) {
    const int64_t begin = num_bytes * c / n;
    const int64_t end = num_bytes * (c + 1) / n;
    std::memset(src.get() + begin, 1 + c, end - begin);
    std::memset(dst.get() + begin, 0, end - begin);
  });
  double best_s = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    pool.parallel_for(n, [&](int c) {
      const int64_t begin = num_bytes * c / n;
      const int64_t end = num_bytes * (c + 1) / n;
      std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
    });
    best_s = std::min(best_s, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return static_cast<double>(num_bytes) / best_s / 1e9;
}

namespace {

// Best of 5 runs of `fn` on every pool thread, in G(FL)OP/s. A run is 12M iterations of the
// kernel's 10-12 independent multiply-adds, ~25-50 ms: with 3 runs of ~9 ms a shared VM could
// report two thirds of the peak (one thread held up in each), and every ratio to it 1.5x high.
double measure_peak(ThreadPool& pool, double (*fn)(int64_t)) {
  const int n = pool.num_threads();
  constexpr int64_t kIters = int64_t{12} << 20;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(n, 0);
    const auto start = Clock::now();
    pool.parallel_for(n, [&](int c) { flops[c] = fn(kIters); });
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    double total = 0;
    for (double f : flops)
      total += f;
    best = std::max(best, total / s / 1e9);
  }
  return best;
}

}  // namespace

double measure_peak_gflops(ThreadPool& pool, WeightFormat format) {
  const internal::KernelTable& table = internal::kernel_table(active_isa());
  return measure_peak(pool, (format == WeightFormat::kBF16 && table.peak_bf16_flops != nullptr)
                                ? table.peak_bf16_flops
                                : table.peak_fma_flops);
}

WeightFormat gemm_peak_format(WeightFormat weights) {
  const internal::KernelTable& table = internal::kernel_table(active_isa());
  const bool dot = weights == WeightFormat::kBF16 && internal::runs_bf16_dot(table);
  return dot ? WeightFormat::kBF16 : WeightFormat::kF32;
}

double measure_peak_int8_gops(ThreadPool& pool) {
  const internal::KernelTable& table = internal::kernel_table(active_isa());
  return table.peak_int8_ops != nullptr ? measure_peak(pool, table.peak_int8_ops) : 0.0;
}

double measure_read_gbps(ThreadPool& pool, int64_t num_bytes, ReadPages pages) {
  const int64_t num_words = num_bytes / 8;
  std::shared_ptr<std::byte> memory;
  if (pages == ReadPages::kLikeWeights) {
    memory = allocate_weight_memory(num_words * 8);
  } else {
    memory.reset(static_cast<std::byte*>(std::aligned_alloc(4096, round_up_4k(num_words * 8))),
                 FreeDeleter());
    CRESCENT_CHECK(memory != nullptr) << "out of memory for the read baseline";
  }
  auto* buf = reinterpret_cast<uint64_t*>(memory.get());
  std::fill(buf, buf + num_words, uint64_t{1});
  const int n = pool.num_threads();
  std::vector<uint64_t> sinks(n * 8);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    pool.parallel_for(n, [&](int c) {
      const int64_t begin = num_words * c / n / 8 * 8;
      const int64_t end = num_words * (c + 1) / n / 8 * 8;
      uint64_t acc[8] = {};
      for (int64_t i = begin; i < end; i += 8) {
        // As far ahead as the decode GEMVs prefetch (kernel_table.h): without it this loop read
        // ~25% less than those kernels on an Intel Xeon VM, no yardstick for them.
        __builtin_prefetch(buf + i + internal::kGemvPrefetchBytes / 8);
        for (int j = 0; j < 8; ++j)
          acc[j] ^= buf[i + j];
      }
      for (int j = 0; j < 8; ++j)
        sinks[c * 8 + j] = acc[j];
    });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return static_cast<double>(num_words * 8) / best / 1e9;
}

}  // namespace crescent::kernels
