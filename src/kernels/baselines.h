#pragma once
// Hardware baselines the kernel benchmarks are judged against, measured in the same run:
// memory copy bandwidth (what a bandwidth-bound GEMV can hope for) and register-only peak
// multiply-add throughput (what a compute-bound GEMM can hope for). Each call takes ~0.1-1 s.

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace crescent::kernels {

// Every pool thread memcpy()s its own contiguous part of a num_bytes buffer into another;
// best of several repetitions; GB/s counting bytes read (= bytes copied).
double measure_memcpy_gbps(ThreadPool& pool, int64_t num_bytes = int64_t{256} << 20);

// A stricter bandwidth reference than memcpy: every thread only reads its part of a large
// buffer (no stores, so no write-allocate traffic). GB/s of bytes read, best of 5.
// kLikeWeights reads memory from allocate_weight_memory, as the GEMVs do (huge pages where THP
// allows: the figure decode is judged against); kDefaultHeap reads aligned_alloc's pages, to show
// what the huge pages are worth (on a VM, 4 KiB pages cost a nested page walk per TLB miss).
enum class ReadPages { kLikeWeights, kDefaultHeap };
double measure_read_gbps(ThreadPool& pool, int64_t num_bytes = int64_t{256} << 20,
                         ReadPages pages = ReadPages::kLikeWeights);

// Register-only multiply-add loop on every pool thread: vdpbf16ps for kBF16 where the active ISA
// has AVX512-BF16, otherwise FP32 FMA at the active ISA's width. 2 flops per multiply-add.
double measure_peak_gflops(ThreadPool& pool, WeightFormat format);
// The format whose peak judges a prefill GEMM on `weights` (F32 or BF16): kBF16 where BF16
// weights multiply on vdpbf16ps (AVX512-BF16 and bf16_gemm_uses_dot()), otherwise kF32: the
// F32 / BF16 FMA GEMM and the f32 math of lower ISAs.
WeightFormat gemm_peak_format(WeightFormat weights);

// The same for int8 dot products (vpdpbusd, what the quantised GEMMs run on); 0 when the active
// ISA has no AVX512-VNNI. 2 ops per multiply-add.
double measure_peak_int8_gops(ThreadPool& pool);

}  // namespace crescent::kernels
