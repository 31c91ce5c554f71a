#include "kernels/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "kernels/baselines.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace crescent::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// Qwen2.5-0.5B: hidden 896, intermediate 4864, 14 heads / 2 KV heads of 64, vocab 151936.
constexpr int64_t kHidden = 896;
constexpr int64_t kIntermediate = 4864;
constexpr int64_t kKvDim = 128;
constexpr int64_t kVocab = 151936;

struct Shape {
  const char* name;
  int64_t rows;
  int64_t cols;
};
constexpr Shape kLayerShapes[] = {
    {"q_proj", kHidden, kHidden},          {"k_proj", kKvDim, kHidden},
    {"v_proj", kKvDim, kHidden},           {"o_proj", kHidden, kHidden},
    {"gate_proj", kIntermediate, kHidden}, {"up_proj", kIntermediate, kHidden},
    {"down_proj", kHidden, kIntermediate},
};

// Deterministic BF16 weights in about [-1, 1] without a slow RNG (xorshift).
std::vector<uint16_t> make_bf16(int64_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float f = static_cast<float>(static_cast<int32_t>(s >> 32)) * (1.0f / 2147483648.0f);
    v[i] = float_to_bf16(f);
  }
  return v;
}

// The ggml K-quant rows need whole 256-value blocks: Qwen2.5-0.5B's 896 inputs become 1024 for
// them (the GB/s figures are per stored byte, so the shapes need not be identical).
Shape shape_for(const Shape& s, WeightFormat format) {
  const std::optional<DType> row = ggml_row_dtype(format);
  if (!row)
    return s;
  const int64_t bs = dtype_block_size(*row);
  return {s.name, s.rows, (s.cols + bs - 1) / bs * bs};
}

Result<PackedWeight> make_weight(const Shape& shape, WeightFormat format, uint64_t seed,
                                 ThreadPool& pool) {
  const Shape s = shape_for(shape, format);
  auto src = make_bf16(s.rows * s.cols, seed);
  const std::optional<DType> row = ggml_row_dtype(format);
  if (!row)
    return pack_weight(src.data(), DType::kBF16, s.rows, s.cols, format);
  // ggml's reference quantisers are slow: quantise rows in parallel, then pack the bytes.
  const int64_t row_bytes = dtype_num_bytes(*row, s.cols);
  std::vector<uint8_t> q(static_cast<size_t>(s.rows * row_bytes));
  pool.parallel_range(s.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> f(s.cols);
    for (int64_t r = r0; r < r1; ++r) {
      dtype_to_float(DType::kBF16, &src[r * s.cols], s.cols, f.data());
      quantize_row(*row, f.data(), s.cols, &q[r * row_bytes]);
    }
  });
  return pack_weight(q.data(), *row, s.rows, s.cols, format);
}

// `list` ("q4_k,q6_k"): each name one of weight_format_name's; an unknown or repeated name is
// refused with the names there are.
Result<std::vector<WeightFormat>> parse_formats(std::string_view list) {
  constexpr WeightFormat kAll[] = {WeightFormat::kF32,   WeightFormat::kBF16, WeightFormat::kQ8_0,
                                   WeightFormat::kQ4_0,  WeightFormat::kQ4_1, WeightFormat::kQ5_0,
                                   WeightFormat::kQ5_1,  WeightFormat::kQ2_K, WeightFormat::kQ3_K,
                                   WeightFormat::kQ4_K,  WeightFormat::kQ5_K, WeightFormat::kQ6_K,
                                   WeightFormat::kIQ4_NL};
  std::vector<WeightFormat> formats;
  for (std::string_view rest = list; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto* it = std::find_if(std::begin(kAll), std::end(kAll),
                                  [&](WeightFormat f) { return weight_format_name(f) == name; });
    if (it == std::end(kAll)) {
      std::string known;
      for (WeightFormat f : kAll) {
        known += (known.empty() ? "" : ", ") + std::string(weight_format_name(f));
      }
      return invalid_argument("--types: unknown weight format '" + std::string(name) +
                              "' (known: " + known + ")");
    }
    if (std::find(formats.begin(), formats.end(), *it) != formats.end()) {
      return invalid_argument("--types: '" + std::string(name) + "' is listed twice");
    }
    formats.push_back(*it);
  }
  if (formats.empty()) {
    return invalid_argument("--types: no weight format given");
  }
  return formats;
}

template <typename Fn>
double best_seconds(int num_reps, Fn&& fn) {
  fn();  // warm-up
  double best = 1e30;
  for (int i = 0; i < num_reps; ++i) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// Causal prefill attention of one prompt over a bf16 paged KV cache (Qwen2.5-0.5B's 14 query /
// 2 KV heads of 64), at the GEMM's token count and four times it: the quadratic part of a long
// prompt's prefill. Its multiply-adds (scores and values) against the f32 FMA peak, the rate the
// attention math runs at.
Status run_attention_benchmark(const KernelBenchOptions& o, double peak_f32, ThreadPool& pool,
                               FILE* out) {
  constexpr int kHeads = 14;
  constexpr int kKvHeads = 2;
  constexpr int kHeadDim = 64;
  constexpr int kBlockSize = 16;
  std::fprintf(out, "\nprefill attention (causal, %d query / %d KV heads of %d, bf16 KV cache):\n",
               kHeads, kKvHeads, kHeadDim);
  std::fprintf(out, "  %-28s %10s %9s %10s\n", "case", "ms", "GFLOP/s", "vs peak");
  for (const int64_t len : {o.prefill_tokens, 4 * o.prefill_tokens}) {
    const KvCacheLayout layout{1, kBlockSize, kKvHeads, kHeadDim, KvDtype::kBf16};
    const int64_t num_blocks = (len + kBlockSize - 1) / kBlockSize;
    std::vector<std::byte> kv(static_cast<size_t>(num_blocks * layout.block_num_bytes()));
    std::vector<int32_t> table(num_blocks);
    for (int64_t b = 0; b < num_blocks; ++b) {
      table[b] = static_cast<int32_t>(num_blocks - 1 - b);  // not in order, as a cache holds them
    }
    const auto to_floats = [](const std::vector<uint16_t>& h) {
      std::vector<float> f(h.size());
      dtype_to_float(DType::kBF16, h.data(), static_cast<int64_t>(h.size()), f.data());
      return f;
    };
    const std::vector<float> k = to_floats(make_bf16(len * kKvHeads * kHeadDim, 11));
    const std::vector<float> v = to_floats(make_bf16(len * kKvHeads * kHeadDim, 12));
    const std::vector<float> q = to_floats(make_bf16(len * kHeads * kHeadDim, 13));
    std::vector<float> o_rows(q.size());
    write_kv(k.data(), v.data(), len, 0, table.data(), 0, layout, kv.data());
    const AttentionSeq seq{0, len, 0, table.data()};
    const double sec = best_seconds(o.num_reps, [&] {
      paged_attention({&seq, 1}, q.data(), kHeads, 0, layout, kv.data(), 0.125f, o_rows.data(),
                      pool);
    });
    // Scores and values: 2 multiply-adds per head, dimension and visible (query, key) pair.
    const double flops = 4.0 * kHeads * kHeadDim * static_cast<double>(len) * (len + 1) / 2;
    const double gflops = flops / sec / 1e9;
    char name[64];
    std::snprintf(name, sizeof(name), "%lld-token prompt", static_cast<long long>(len));
    std::fprintf(out, "  %-28s %10.3f %9.1f %10.2f (of f32 peak)\n", name, sec * 1e3, gflops,
                 gflops / peak_f32);
  }
  return Status::ok();
}

}  // namespace

Status run_kernel_benchmarks(const KernelBenchOptions& o, FILE* out) {
  if (o.num_threads < 1 || o.prefill_tokens < 1 || o.num_reps < 1) {
    return invalid_argument("threads, tokens and reps must be >= 1");
  }
  if (!o.isa.empty()) {
    ASSIGN_OR_RETURN(Isa isa, parse_isa(o.isa));
    RETURN_IF_ERROR(set_active_isa(isa));
  }
  ASSIGN_OR_RETURN(const std::vector<WeightFormat> formats, parse_formats(o.types));
  ThreadPool pool(o.num_threads);
  const double memcpy_gbps = measure_memcpy_gbps(pool);
  const double peak_bf16 = measure_peak_gflops(pool, WeightFormat::kBF16);
  const double peak_f32 = measure_peak_gflops(pool, WeightFormat::kF32);
  const double peak_int8 = measure_peak_int8_gops(pool);
  std::fprintf(out, "kernels benchmark: isa=%s (detected %s), %d threads\n",
               std::string(isa_name(active_isa())).c_str(),
               std::string(isa_name(detected_isa())).c_str(), o.num_threads);
  const double read_gbps = measure_read_gbps(pool, int64_t{256} << 20);
  const double read_small_pages_gbps =
      measure_read_gbps(pool, int64_t{256} << 20, ReadPages::kDefaultHeap);
  std::fprintf(out,
               "baseline memcpy: %.1f GB/s (bytes read); read-only stream: %.1f GB/s from weight "
               "memory (huge pages where THP allows), %.1f GB/s from the default heap\n",
               memcpy_gbps, read_gbps, read_small_pages_gbps);
  std::fprintf(out,
               "baseline peak: %.0f GFLOP/s (bf16 multiply-add), %.0f GFLOP/s (f32 FMA), %.0f "
               "GOP/s (int8 vpdpbusd; 0 = no VNNI)\n\n",
               peak_bf16, peak_f32, peak_int8);

  // --- Decode GEMV: one token through a stack of layers that does not fit in cache. ---
  std::fprintf(out, "decode GEMV (1 token), weights streamed from DRAM:\n");
  std::fprintf(out, "  %-28s %10s %10s %9s %10s %10s\n", "case", "MB", "ms", "GB/s", "vs memcpy",
               "vs read");
  std::vector<float> x(kIntermediate + 256, 0.5f);
  std::vector<float> y(kVocab);
  for (WeightFormat format : formats) {
    std::vector<PackedWeight> stack;
    int64_t stack_bytes = 0;
    uint64_t seed = 1;
    for (int l = 0; l < o.num_stack_layers; ++l) {
      for (const Shape& s : kLayerShapes) {
        ASSIGN_OR_RETURN(PackedWeight w, make_weight(s, format, seed++, pool));
        stack_bytes += w.num_bytes();
        stack.push_back(std::move(w));
      }
    }
    const double s = best_seconds(o.num_reps, [&] {
      for (const PackedWeight& w : stack)
        matmul(x.data(), 1, w, nullptr, y.data(), pool);
    });
    const double gbps = static_cast<double>(stack_bytes) / s / 1e9;
    char name[64];
    std::snprintf(name, sizeof(name), "%d-layer stack %s", o.num_stack_layers,
                  std::string(weight_format_name(format)).c_str());
    std::fprintf(out, "  %-28s %10.1f %10.3f %9.1f %10.2f %10.2f\n", name, stack_bytes / 1e6,
                 s * 1e3, gbps, gbps / memcpy_gbps, gbps / read_gbps);
    if (o.include_lm_head && format != WeightFormat::kF32) {
      ASSIGN_OR_RETURN(PackedWeight lm,
                       make_weight({"lm_head", kVocab, kHidden}, format, 99, pool));
      const double ls =
          best_seconds(o.num_reps, [&] { matmul(x.data(), 1, lm, nullptr, y.data(), pool); });
      const double lgbps = static_cast<double>(lm.num_bytes()) / ls / 1e9;
      std::snprintf(name, sizeof(name), "lm_head %s",
                    std::string(weight_format_name(format)).c_str());
      std::fprintf(out, "  %-28s %10.1f %10.3f %9.1f %10.2f %10.2f\n", name, lm.num_bytes() / 1e6,
                   ls * 1e3, lgbps, lgbps / memcpy_gbps, lgbps / read_gbps);
    }
  }

  // --- Prefill GEMM. ---
  const int64_t nt = o.prefill_tokens;
  std::fprintf(out, "\nprefill GEMM (%lld tokens):\n", static_cast<long long>(nt));
  std::fprintf(out, "  %-28s %10s %9s %10s\n", "case", "ms", "GFLOP/s", "vs peak");
  std::vector<float> xp(nt * (kIntermediate + 256), 0.25f);
  std::vector<float> yp(nt * kIntermediate);
  for (WeightFormat format : formats) {
    for (const Shape& shape : {kLayerShapes[0], kLayerShapes[4], kLayerShapes[6]}) {
      const Shape s = shape_for(shape, format);
      ASSIGN_OR_RETURN(PackedWeight w, make_weight(s, format, 7, pool));
      const double sec =
          best_seconds(o.num_reps, [&] { matmul(xp.data(), nt, w, nullptr, yp.data(), pool); });
      const double gflops = 2.0 * nt * s.rows * s.cols / sec / 1e9;
      // The quantised formats run on int8 dot products (GOP/s against the vpdpbusd peak).
      const bool quantised = format != WeightFormat::kBF16 && format != WeightFormat::kF32;
      // BF16 against the peak of what its GEMM multiplies with (vdpbf16ps or FMA).
      const bool bf16_dot = !quantised && gemm_peak_format(format) == WeightFormat::kBF16;
      const double peak = quantised ? peak_int8 : bf16_dot ? peak_bf16 : peak_f32;
      const char* peak_name = quantised  ? " (of int8 peak)"
                              : bf16_dot ? " (of bf16 peak)"
                                         : " (of f32 peak)";
      char name[64];
      std::snprintf(name, sizeof(name), "%s %lldx%lld %s", s.name, static_cast<long long>(s.rows),
                    static_cast<long long>(s.cols),
                    std::string(weight_format_name(format)).c_str());
      if (peak <= 0) {
        std::fprintf(out, "  %-28s %10.3f %9.1f %10s\n", name, sec * 1e3, gflops, "-");
      } else {
        std::fprintf(out, "  %-28s %10.3f %9.1f %10.2f%s\n", name, sec * 1e3, gflops, gflops / peak,
                     peak_name);
      }
    }
  }
  return run_attention_benchmark(o, peak_f32, pool, out);
}

}  // namespace crescent::kernels
