#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/kernel_table.h"

namespace crescent::kernels {
namespace {

using internal::MatmulArgs;

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Converts row r of a row-major source weight to floats.
void source_row_to_float(const void* data, DType dtype, int64_t cols, int64_t r, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(data) + r * cols, cols * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        out[c] = bf16_to_float(src[c]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        out[c] = f16_to_float(src[c]);
      return;
    }
    case DType::kQ8_0: {
      int64_t num_blocks = cols / kQ8BlockSize;
      const std::byte* src = static_cast<const std::byte*>(data) + r * num_blocks * sizeof(Q8Block);
      for (int64_t b = 0; b < num_blocks; ++b) {
        Q8Block block;
        std::memcpy(&block, src + b * sizeof(Q8Block), sizeof(Q8Block));
        float d = f16_to_float(block.scale_f16);
        for (int64_t i = 0; i < kQ8BlockSize; ++i)
          out[b * kQ8BlockSize + i] = d * block.quants[i];
      }
      return;
    }
  }
}

// ggml's quantize_row_q8_0_ref for one block of 32 floats.
Q8Block quantize_block(const float* x) {
  float amax = 0;
  for (int i = 0; i < kQ8BlockSize; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  float d = amax / 127.0f;
  float id = d != 0 ? 1.0f / d : 0.0f;
  Q8Block block;
  block.scale_f16 = float_to_f16(d);
  for (int i = 0; i < kQ8BlockSize; ++i) {
    block.quants[i] = static_cast<int8_t>(std::lround(x[i] * id));
  }
  return block;
}

// Stores one Q8_0 block of row `r_in_panel`, column block `b`, in the panel layout.
void store_q8_block(std::byte* panel, int64_t padded_cols, int64_t r_in_panel, int64_t b,
                    const Q8Block& block) {
  auto* scales = reinterpret_cast<uint16_t*>(panel);
  scales[b * kPanelRows + r_in_panel] = block.scale_f16;
  auto* quants =
      reinterpret_cast<uint8_t*>(panel + internal::q8_scale_region_bytes(padded_cols)) + b * 512;
  for (int j = 0; j < 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      quants[j * 64 + r_in_panel * 4 + e] =
          static_cast<uint8_t>(block.quants[j * 4 + e]) ^ uint8_t { 0x80 };
    }
  }
}

}  // namespace

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kQ8_0:
      return "q8_0";
  }
  return "unknown";
}

void PackedWeight::FreeDeleter::operator()(std::byte* p) const {
  std::free(p);
}

PackedWeight PackedWeight::allocate(int64_t rows, int64_t cols, WeightFormat format) {
  CRESCENT_CHECK(rows > 0 && cols > 0) << rows << "x" << cols;
  PackedWeight w;
  w.rows_ = rows;
  w.cols_ = cols;
  w.format_ = format;
  switch (format) {
    case WeightFormat::kF32:
      w.padded_cols_ = round_up(cols, 2);
      w.panel_stride_bytes_ = w.padded_cols_ * kPanelRows * 4;
      break;
    case WeightFormat::kBF16:
      w.padded_cols_ = round_up(cols, 2);
      w.panel_stride_bytes_ = w.padded_cols_ * kPanelRows * 2;
      break;
    case WeightFormat::kQ8_0:
      w.padded_cols_ = round_up(cols, kQ8BlockSize);
      w.panel_stride_bytes_ =
          internal::q8_scale_region_bytes(w.padded_cols_) + w.padded_cols_ / 32 * 512;
      break;
  }
  w.panel_stride_bytes_ = round_up(w.panel_stride_bytes_, 64);
  w.num_bytes_ = w.num_panels() * w.panel_stride_bytes_;
  void* p = std::aligned_alloc(64, static_cast<size_t>(w.num_bytes_));
  CRESCENT_CHECK(p != nullptr) << "out of memory packing a " << rows << "x" << cols << " weight";
  std::memset(p, 0, static_cast<size_t>(w.num_bytes_));
  w.data_.reset(static_cast<std::byte*>(p));
  return w;
}

Result<PackedWeight> pack_weight(const void* data, DType dtype, int64_t rows, int64_t cols,
                                 WeightFormat format) {
  if (data == nullptr || rows <= 0 || cols <= 0) {
    return invalid_argument("pack_weight: empty weight " + std::to_string(rows) + "x" +
                            std::to_string(cols));
  }
  if (dtype == DType::kQ8_0 && cols % kQ8BlockSize != 0) {
    return invalid_argument("pack_weight: a Q8_0 weight needs cols % 32 == 0, got " +
                            std::to_string(cols));
  }
  PackedWeight w = PackedWeight::allocate(rows, cols, format);
  const int64_t kp = w.padded_cols();
  std::vector<float> row(kp, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    std::byte* panel = w.mutable_panel(r / kPanelRows);
    const int64_t ri = r % kPanelRows;
    if (format == WeightFormat::kQ8_0 && dtype == DType::kQ8_0) {
      const std::byte* src =
          static_cast<const std::byte*>(data) + r * (cols / kQ8BlockSize) * sizeof(Q8Block);
      for (int64_t b = 0; b < cols / kQ8BlockSize; ++b) {
        Q8Block block;
        std::memcpy(&block, src + b * sizeof(Q8Block), sizeof(Q8Block));
        store_q8_block(panel, kp, ri, b, block);
      }
      continue;
    }
    source_row_to_float(data, dtype, cols, r, row.data());
    switch (format) {
      case WeightFormat::kF32: {
        auto* dst = reinterpret_cast<float*>(panel);
        for (int64_t c = 0; c < cols; ++c)
          dst[c * kPanelRows + ri] = row[c];
        break;
      }
      case WeightFormat::kBF16: {
        // K-pair interleaved: [pair][row][2].
        auto* dst = reinterpret_cast<uint16_t*>(panel);
        for (int64_t c = 0; c < cols; ++c) {
          dst[(c / 2) * 2 * kPanelRows + ri * 2 + (c % 2)] = float_to_bf16(row[c]);
        }
        break;
      }
      case WeightFormat::kQ8_0:
        for (int64_t b = 0; b < kp / kQ8BlockSize; ++b) {
          store_q8_block(panel, kp, ri, b, quantize_block(row.data() + b * kQ8BlockSize));
        }
        break;
    }
  }
  return w;
}

std::vector<float> unpack_weight(const PackedWeight& w) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  const int64_t kp = w.padded_cols();
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const std::byte* panel = w.panel(r / kPanelRows);
    const int64_t ri = r % kPanelRows;
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0;
      switch (w.format()) {
        case WeightFormat::kF32:
          v = reinterpret_cast<const float*>(panel)[c * kPanelRows + ri];
          break;
        case WeightFormat::kBF16:
          v = bf16_to_float(
              reinterpret_cast<const uint16_t*>(panel)[(c / 2) * 2 * kPanelRows + ri * 2 + c % 2]);
          break;
        case WeightFormat::kQ8_0: {
          int64_t b = c / 32;
          int64_t j = (c % 32) / 4;
          int64_t e = c % 4;
          float d = f16_to_float(reinterpret_cast<const uint16_t*>(panel)[b * kPanelRows + ri]);
          auto u = reinterpret_cast<const uint8_t*>(
              panel + internal::q8_scale_region_bytes(kp))[b * 512 + j * 64 + ri * 4 + e];
          v = d * static_cast<int8_t>(u ^ 0x80);
          break;
        }
      }
      out[r * cols + c] = v;
    }
  }
  return out;
}

namespace internal {

void quantize_row_q8(const float* x, int64_t n, int8_t* quants, float* scales, int32_t* sums) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(xb[i]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      int q = static_cast<int>(std::lround(xb[i] * id));
      quants[b * 32 + i] = static_cast<int8_t>(q);
      sum += q;
    }
    scales[b] = d;
    sums[b] = sum;
  }
}

}  // namespace internal

void matmul(const float* x, int64_t num_tokens, const PackedWeight& w, const float* bias, float* y,
            ThreadPool& pool) {
  CRESCENT_CHECK(w.rows() > 0) << "matmul with an empty weight";
  if (num_tokens <= 0)
    return;
  const internal::KernelTable& table = internal::active_table();
  const int64_t cols = w.cols();
  const int64_t kp = w.padded_cols();
  MatmulArgs args;
  args.w = &w;
  args.num_tokens = num_tokens;
  args.bias = bias;
  args.y = y;

  std::vector<float> x_padded;
  std::vector<uint32_t> x_bf16;
  std::vector<int8_t> xq;
  std::vector<float> x_scale;
  std::vector<int32_t> x_sum;
  auto pad_x = [&] {
    if (kp == cols) {
      args.x = x;
      return;
    }
    x_padded.assign(num_tokens * kp, 0.0f);
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::memcpy(&x_padded[t * kp], x + t * cols, cols * sizeof(float));
    }
    args.x = x_padded.data();
  };

  internal::MatmulPanelsFn fn = nullptr;
  switch (w.format()) {
    case WeightFormat::kF32:
      pad_x();
      fn = table.matmul_f32;
      break;
    case WeightFormat::kBF16:
      if (table.gemm_bf16_dot != nullptr && num_tokens >= kGemmMinTokens) {
        const int64_t num_pairs = kp / 2;
        constexpr int64_t kTb = internal::kBf16GemmTokens;
        const int64_t num_token_blocks = (num_tokens + kTb - 1) / kTb;
        x_bf16.assign(num_token_blocks * num_pairs * kTb, 0);
        pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const float* xt = x + t * cols;
            uint32_t* dst = &x_bf16[(t / kTb) * num_pairs * kTb + t % kTb];
            for (int64_t p = 0; p < num_pairs; ++p) {
              uint32_t lo = float_to_bf16(xt[2 * p]);
              uint32_t hi = 2 * p + 1 < cols ? float_to_bf16(xt[2 * p + 1]) : 0;
              dst[p * kTb] = lo | (hi << 16);
            }
          }
        });
        args.x_bf16 = x_bf16.data();
        fn = table.gemm_bf16_dot;
      } else {
        pad_x();
        fn = table.matmul_bf16;
      }
      break;
    case WeightFormat::kQ8_0: {
      const int64_t num_blocks = kp / 32;
      xq.resize(num_tokens * kp);
      x_scale.resize(num_tokens * num_blocks);
      x_sum.resize(num_tokens * num_blocks);
      pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
        std::vector<float> row(kp, 0.0f);
        for (int64_t t = t0; t < t1; ++t) {
          std::memcpy(row.data(), x + t * cols, cols * sizeof(float));
          internal::quantize_row_q8(row.data(), kp, &xq[t * kp], &x_scale[t * num_blocks],
                                    &x_sum[t * num_blocks]);
        }
      });
      args.xq = xq.data();
      args.x_scale = x_scale.data();
      args.x_sum = x_sum.data();
      fn = table.matmul_q8;
      break;
    }
  }
  CRESCENT_CHECK(fn != nullptr) << "no kernel for " << weight_format_name(w.format());

  // Contiguous ranges of panel pairs, one per thread: each thread streams its own part of the
  // weight, and no two threads write the same 128-byte run of an output row.
  const int64_t num_panels = w.num_panels();
  const int64_t num_pairs = (num_panels + 1) / 2;
  const int64_t num_chunks = std::min<int64_t>(pool.num_threads(), num_pairs);
  pool.parallel_for(static_cast<int>(num_chunks), [&](int c) {
    int64_t begin = std::min(num_panels, num_pairs * c / num_chunks * 2);
    int64_t end = std::min(num_panels, num_pairs * (c + 1) / num_chunks * 2);
    if (begin < end)
      fn(args, begin, end);
  });
}

}  // namespace crescent::kernels
