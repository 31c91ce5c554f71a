#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/kernel_table.h"
#include "kernels/weight_memory.h"
#include "kernels/x16.h"

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
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL: {
      const int64_t row_bytes = dtype_num_bytes(dtype, cols);
      dtype_to_float(dtype, static_cast<const std::byte*>(data) + r * row_bytes, cols, out);
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
  CRESCENT_CHECK(b < padded_cols / 32) << b;
  reinterpret_cast<uint16_t*>(panel + internal::q8_scales_offset(b))[r_in_panel] = block.scale_f16;
  auto* quants = reinterpret_cast<uint8_t*>(panel + internal::q8_quants_offset(b));
  for (int j = 0; j < 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      quants[j * 64 + r_in_panel * 4 + e] =
          static_cast<uint8_t>(block.quants[j * 4 + e]) ^ uint8_t { 0x80 };
    }
  }
}

// ggml row formats: every row dotted with every token's quantised activations, up to
// kMaxDotTokens tokens per call so a weight block is unpacked once for all of them; the row (a few
// KiB at most) stays in L1 across the calls for more tokens.
void matmul_ggml_rows(const MatmulArgs& a, int64_t panel_begin, int64_t panel_end) {
  const PackedWeight& w = *a.w;
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  const int64_t kp = w.padded_cols();
  const int64_t q8k_blocks = kp / kQKBlockSize;
  std::vector<QuantizedActs> acts(static_cast<size_t>(a.num_tokens));
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    if (a.x_q8k != nullptr) {
      acts[t].q8_k = a.x_q8k + t * q8k_blocks;
    } else {
      acts[t].q8_0 = a.xq + t * kp;
      acts[t].q8_0_scale = a.x_scale + t * (kp / 32);
      acts[t].q8_0_sum = a.x_sum + t * (kp / 32);
    }
  }
  const int64_t r_end = std::min(rows, panel_end * kPanelRows);
  float out[internal::kMaxDotTokens];
  // An x16 weight on a table without its kernel (a lower ISA than the one it was packed under):
  // each row put back in the file's layout first.
  std::vector<std::byte> file_row(w.is_x16() ? w.row_bytes() : 0);
  const DType type = *ggml_row_dtype(w.format());
  for (int64_t r = panel_begin * kPanelRows; r < r_end; ++r) {
    const std::byte* row = file_row.data();
    if (w.is_x16()) {
      load_x16_row(type, w.panel(r / kPanelRows), cols / dtype_block_size(type),
                   static_cast<int>(r % kPanelRows), file_row.data());
    } else {
      row = w.panel(r / kPanelRows) + (r % kPanelRows) * w.row_bytes();
      internal::prefetch_ahead_of(row, w.row_bytes());
    }
    const float bias = a.bias != nullptr ? a.bias[r] : 0.0f;
    for (int64_t t0 = 0; t0 < a.num_tokens; t0 += internal::kMaxDotTokens) {
      const int n = static_cast<int>(std::min<int64_t>(internal::kMaxDotTokens, a.num_tokens - t0));
      a.row_dot(cols, row, &acts[t0], n, out);
      for (int i = 0; i < n; ++i)
        a.y[(t0 + i) * rows + r] = out[i] + bias;
    }
  }
}

// Quantises every token's row to Q8_0 blocks of 32 (the dot partner of Q8_0 and the legacy
// types) into *xq, *scale and *sum, and points args at them. A row is copied first only where the
// panels pad it (cols not a multiple of 32).
void quantize_tokens_q8(const float* x, int64_t num_tokens, int64_t cols, int64_t kp,
                        ThreadPool& pool, MatmulArgs* args, std::vector<int8_t>* xq,
                        std::vector<float>* scale, std::vector<int32_t>* sum) {
  const int64_t num_blocks = kp / 32;
  xq->resize(num_tokens * kp);
  scale->resize(num_tokens * num_blocks);
  sum->resize(num_tokens * num_blocks);
  pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(kp == cols ? 0 : kp, 0.0f);
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * cols;
      if (kp != cols) {
        std::memcpy(row.data(), xt, cols * sizeof(float));
        xt = row.data();
      }
      internal::quantize_row_q8(xt, kp, xq->data() + t * kp, scale->data() + t * num_blocks,
                                sum->data() + t * num_blocks);
    }
  });
  args->xq = xq->data();
  args->x_scale = scale->data();
  args->x_sum = sum->data();
}

// The ggml GEMM's activations (MatmulArgs::xq, x_block_scale, x_group_start / x_group_sum).
// The legacy types' Q8_0 blocks (already in *args from quantize_tokens_q8) are their scale
// groups, so their quants and scales serve as they are and only the sums change form. The
// K-quants' activations are quantised here straight from x, one 256-value Q8_K block at a time
// (the same bits as quantize_row_q8_k), into flat int8 quants, one scale per block and the sums
// of each weight scale group (16 or 32 values) from the block's 16-value sums; no Q8_K row is
// stored.
void prepare_group_acts(DType type, const float* x, int64_t cols, int64_t num_tokens, int64_t kp,
                        ThreadPool& pool, MatmulArgs* args, std::vector<int8_t>* xq,
                        std::vector<float>* block_scale, std::vector<int32_t>* group_start,
                        std::vector<float>* group_sum) {
  const int group = internal::ggml_gemm_group_size(type);
  const int bias = internal::ggml_gemm_bias(type);
  args->group_size = group;
  const int64_t groups = kp / group;
  const bool from_x = dots_with_q8_k(type);
  const int64_t nb = kp / kQKBlockSize;
  const int per_block = kQKBlockSize / group;
  if (bias != 0) {
    group_start->resize(num_tokens * groups);
  } else {
    group_sum->resize(num_tokens * groups);
  }
  if (from_x) {
    CRESCENT_CHECK(cols == kp) << "K-quant rows are whole 256-value blocks";
    xq->resize(num_tokens * kp);
    block_scale->resize(num_tokens * nb);
  }
  pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto put = [&](int64_t g, int32_t sum) {
        if (bias != 0) {
          (*group_start)[t * groups + g] = -bias * sum;
        } else {
          (*group_sum)[t * groups + g] = static_cast<float>(sum);
        }
      };
      if (!from_x) {
        for (int64_t g = 0; g < groups; ++g) {
          put(g, args->x_sum[t * groups + g]);
        }
        continue;
      }
      for (int64_t b = 0; b < nb; ++b) {
        BlockQ8K blk;
        quantize_row_q8_k(x + t * cols + b * kQKBlockSize, kQKBlockSize, &blk);
        std::memcpy(xq->data() + t * kp + b * kQKBlockSize, blk.qs, kQKBlockSize);
        (*block_scale)[t * nb + b] = blk.d;
        for (int g = 0; g < per_block; ++g) {
          int32_t s = 0;
          for (int j = g * group / 16; j < (g + 1) * group / 16; ++j)
            s += blk.bsums[j];
          put(b * per_block + g, s);
        }
      }
    }
  });
  if (from_x) {
    args->xq = xq->data();
    args->x_block_scale = block_scale->data();
  } else {
    args->x_block_scale = args->x_scale;
  }
  args->x_group_start = bias != 0 ? group_start->data() : nullptr;
  args->x_group_sum = bias != 0 ? nullptr : group_sum->data();
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
    case WeightFormat::kQ4_0:
      return "q4_0";
    case WeightFormat::kQ4_1:
      return "q4_1";
    case WeightFormat::kQ5_0:
      return "q5_0";
    case WeightFormat::kQ5_1:
      return "q5_1";
    case WeightFormat::kQ2_K:
      return "q2_k";
    case WeightFormat::kQ3_K:
      return "q3_k";
    case WeightFormat::kQ4_K:
      return "q4_k";
    case WeightFormat::kQ5_K:
      return "q5_k";
    case WeightFormat::kQ6_K:
      return "q6_k";
    case WeightFormat::kIQ4_NL:
      return "iq4_nl";
  }
  return "unknown";
}

std::optional<DType> ggml_row_dtype(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
    case WeightFormat::kBF16:
    case WeightFormat::kQ8_0:
      return std::nullopt;
    case WeightFormat::kQ4_0:
      return DType::kQ4_0;
    case WeightFormat::kQ4_1:
      return DType::kQ4_1;
    case WeightFormat::kQ5_0:
      return DType::kQ5_0;
    case WeightFormat::kQ5_1:
      return DType::kQ5_1;
    case WeightFormat::kQ2_K:
      return DType::kQ2_K;
    case WeightFormat::kQ3_K:
      return DType::kQ3_K;
    case WeightFormat::kQ4_K:
      return DType::kQ4_K;
    case WeightFormat::kQ5_K:
      return DType::kQ5_K;
    case WeightFormat::kQ6_K:
      return DType::kQ6_K;
    case WeightFormat::kIQ4_NL:
      return DType::kIQ4_NL;
  }
  return std::nullopt;
}

std::optional<WeightFormat> native_weight_format(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return std::nullopt;
    case DType::kQ8_0:
      return WeightFormat::kQ8_0;
    case DType::kQ4_0:
      return WeightFormat::kQ4_0;
    case DType::kQ4_1:
      return WeightFormat::kQ4_1;
    case DType::kQ5_0:
      return WeightFormat::kQ5_0;
    case DType::kQ5_1:
      return WeightFormat::kQ5_1;
    case DType::kQ2_K:
      return WeightFormat::kQ2_K;
    case DType::kQ3_K:
      return WeightFormat::kQ3_K;
    case DType::kQ4_K:
      return WeightFormat::kQ4_K;
    case DType::kQ5_K:
      return WeightFormat::kQ5_K;
    case DType::kQ6_K:
      return WeightFormat::kQ6_K;
    case DType::kIQ4_NL:
      return WeightFormat::kIQ4_NL;
  }
  return std::nullopt;
}

PackedWeight PackedWeight::allocate(int64_t rows, int64_t cols, WeightFormat format,
                                    WeightStorage storage) {
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
      w.panel_stride_bytes_ = internal::q8_panel_bytes(w.padded_cols_);
      break;
    default: {  // ggml rows: the file's blocks, 16 rows per panel
      const DType type = *ggml_row_dtype(format);
      CRESCENT_CHECK(cols % dtype_block_size(type) == 0)
          << cols << " columns are not whole " << dtype_name(type) << " blocks";
      w.padded_cols_ = cols;
      w.row_bytes_ = dtype_num_bytes(type, cols);
      w.panel_stride_bytes_ = w.row_bytes_ * kPanelRows;
      break;
    }
  }
  w.panel_stride_bytes_ = round_up(w.panel_stride_bytes_, 64);
  w.num_bytes_ = w.num_panels() * w.panel_stride_bytes_;
  w.data_ = allocate_weight_memory(w.num_bytes_, storage);
  return w;
}

Result<PackedWeight> pack_weight(const void* data, DType dtype, int64_t rows, int64_t cols,
                                 WeightFormat format, WeightStorage storage) {
  if (data == nullptr || rows <= 0 || cols <= 0) {
    return invalid_argument("pack_weight: empty weight " + std::to_string(rows) + "x" +
                            std::to_string(cols));
  }
  if (cols % dtype_block_size(dtype) != 0) {
    return invalid_argument("pack_weight: a " + std::string(dtype_name(dtype)) +
                            " weight needs cols % " + std::to_string(dtype_block_size(dtype)) +
                            " == 0, got " + std::to_string(cols));
  }
  const std::optional<DType> row_dtype = ggml_row_dtype(format);
  if (row_dtype && cols % dtype_block_size(*row_dtype) != 0) {
    return invalid_argument("pack_weight: " + std::to_string(cols) +
                            " columns cannot be stored as " + std::string(dtype_name(*row_dtype)) +
                            " (blocks of " + std::to_string(dtype_block_size(*row_dtype)) + ")");
  }
  PackedWeight w = PackedWeight::allocate(rows, cols, format, storage);
  if (row_dtype) {
    // The x16 layout pays where its kernel is; the other tables compute on it too (slowly).
    w.x16_ = internal::x16_gemv(internal::active_table(), *row_dtype) != nullptr;
    const int64_t row_bytes = w.row_bytes();
    const int64_t num_blocks = cols / dtype_block_size(*row_dtype);
    const auto* src = static_cast<const std::byte*>(data);
    std::vector<float> row(cols);
    std::vector<std::byte> quantized(row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      std::byte* panel = w.mutable_panel(r / kPanelRows);
      const int ri = static_cast<int>(r % kPanelRows);
      const std::byte* blocks = src + r * row_bytes;
      if (dtype != *row_dtype) {
        source_row_to_float(data, dtype, cols, r, row.data());
        quantize_row(*row_dtype, row.data(), cols, quantized.data());
        blocks = quantized.data();
      }
      if (w.x16_) {
        store_x16_row(*row_dtype, blocks, num_blocks, ri, panel);
      } else {
        std::memcpy(panel + ri * row_bytes, blocks, row_bytes);
      }
    }
    return w;
  }
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
      default:
        CRESCENT_CHECK(false) << "ggml row formats are packed above";
    }
  }
  return w;
}

std::vector<std::byte> panel_file_rows(const PackedWeight& w, int64_t p) {
  const std::optional<DType> row_dtype = ggml_row_dtype(w.format());
  CRESCENT_CHECK(row_dtype.has_value()) << weight_format_name(w.format()) << " has no ggml rows";
  CRESCENT_CHECK(p >= 0 && p < w.num_panels()) << p;
  const int64_t row_bytes = w.row_bytes();
  std::vector<std::byte> out(kPanelRows * row_bytes);
  if (!w.is_x16()) {
    std::memcpy(out.data(), w.panel(p), out.size());
    return out;
  }
  for (int r = 0; r < kPanelRows; ++r) {
    load_x16_row(*row_dtype, w.panel(p), w.cols() / dtype_block_size(*row_dtype), r,
                 out.data() + r * row_bytes);
  }
  return out;
}

std::vector<float> unpack_weight(const PackedWeight& w) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  std::vector<float> out(rows * cols);
  if (const std::optional<DType> row_dtype = ggml_row_dtype(w.format())) {
    for (int64_t p = 0; p < w.num_panels(); ++p) {
      const std::vector<std::byte> panel = panel_file_rows(w, p);
      for (int64_t r = p * kPanelRows; r < std::min(rows, (p + 1) * kPanelRows); ++r) {
        dtype_to_float(*row_dtype, panel.data() + (r % kPanelRows) * w.row_bytes(), cols,
                       &out[r * cols]);
      }
    }
    return out;
  }
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
          float d = f16_to_float(
              reinterpret_cast<const uint16_t*>(panel + internal::q8_scales_offset(b))[ri]);
          auto u = reinterpret_cast<const uint8_t*>(
              panel + internal::q8_quants_offset(b))[j * 64 + ri * 4 + e];
          v = d * static_cast<int8_t>(u ^ 0x80);
          break;
        }
        default:
          break;
      }
      out[r * cols + c] = v;
    }
  }
  return out;
}

namespace internal {

void quantize_row_q8(const float* x, int64_t n, int8_t* quants, float* scales, int32_t* sums) {
  if (const auto fn = active_table().quantize_q8; fn != nullptr) {
    fn(x, n, quants, scales, sums);
    return;
  }
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(xb[i]));
    const Q8Scale s = q8_scale_for(amax);
    // Rounding through the float mantissa (kQ8RoundMagic) rather than std::lround, a libm call
    // per value, which made quantising the activations a third of a Q5_0 prefill matmul.
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = xb[i] * s.inverse + kQ8RoundMagic;
      int32_t bits;
      std::memcpy(&bits, &v, 4);
      const int32_t q = (bits & 0x007fffff) - 0x00400000;
      quants[b * 32 + i] = static_cast<int8_t>(q);
      sum += q;
    }
    // ggml's block_q8_0 keeps d as f16 (the quants come from the f32 d, as here): rounding it the
    // same way makes the Q4_0/Q5_0/IQ4_NL/Q8_0 block dots equal ggml's, which decides near-tied
    // greedy tokens alike (Q4_1/Q5_1 still differ: ggml's Q8_1 stores f16(d * sum) for the min).
    scales[b] = s.stored;
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
  std::vector<BlockQ8K> x_q8k;
  std::vector<float> x_block_scale;
  std::vector<int32_t> x_group_start;
  std::vector<float> x_group_sum;
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

  // The FMA GEMM's order: [token block][column][kTb], zero past cols and num_tokens.
  std::vector<float> x_blocked;
  auto block_x = [&] {
    constexpr int64_t kTb = internal::kF32GemmTokens;
    const int64_t num_token_blocks = (num_tokens + kTb - 1) / kTb;
    x_blocked.assign(num_token_blocks * kp * kTb, 0.0f);
    pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* xt = x + t * cols;
        float* dst = &x_blocked[(t / kTb) * kp * kTb + t % kTb];
        for (int64_t c = 0; c < cols; ++c) {
          dst[c * kTb] = xt[c];
        }
      }
    });
    args.x_blocked = x_blocked.data();
  };

  internal::MatmulPanelsFn fn = nullptr;
  switch (w.format()) {
    case WeightFormat::kF32:
      if (table.gemm_f32 != nullptr && num_tokens >= kGemmMinTokens) {
        block_x();
        fn = table.gemm_f32;
      } else {
        pad_x();
        fn = table.matmul_f32;
      }
      break;
    case WeightFormat::kBF16:
      if (internal::runs_bf16_dot(table) && num_tokens >= kGemmMinTokens) {
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
      } else if (table.gemm_bf16_fma != nullptr && num_tokens >= kGemmMinTokens) {
        block_x();
        fn = table.gemm_bf16_fma;
      } else {
        pad_x();
        fn = table.matmul_bf16;
      }
      break;
    case WeightFormat::kQ8_0: {
      quantize_tokens_q8(x, num_tokens, cols, kp, pool, &args, &xq, &x_scale, &x_sum);
      fn = table.matmul_q8;
      if (table.gemm_q8 != nullptr && num_tokens >= internal::kQ8GemmMinTokens) {
        prepare_group_acts(DType::kQ8_0, x, cols, num_tokens, kp, pool, &args, &xq, &x_block_scale,
                           &x_group_start, &x_group_sum);
        fn = table.gemm_q8;
      }
      break;
    }
    default: {
      const DType type = *ggml_row_dtype(w.format());
      args.row_dot = table.row_dot[static_cast<int>(type)];
      fn = args.row_dot != nullptr ? matmul_ggml_rows : nullptr;
      int64_t gemm_min_tokens = internal::kGgmlGemmMinTokens;
      if (internal::MatmulPanelsFn gemv = internal::x16_gemv(table, type);
          w.is_x16() && gemv != nullptr) {
        fn = gemv;
        gemm_min_tokens = internal::kX16GemmMinTokens;
      }
      const bool gemm = table.gemm_ggml != nullptr && num_tokens >= gemm_min_tokens;
      if (!dots_with_q8_k(type)) {
        quantize_tokens_q8(x, num_tokens, cols, kp, pool, &args, &xq, &x_scale, &x_sum);
      } else if (!gemm) {
        const int64_t nb = kp / kQKBlockSize;
        x_q8k.resize(num_tokens * nb);
        pool.parallel_range(num_tokens, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t)
            quantize_row_q8_k(x + t * cols, cols, &x_q8k[t * nb]);
        });
        args.x_q8k = x_q8k.data();
      }
      if (gemm) {
        prepare_group_acts(type, x, cols, num_tokens, kp, pool, &args, &xq, &x_block_scale,
                           &x_group_start, &x_group_sum);
        fn = table.gemm_ggml;
      }
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
