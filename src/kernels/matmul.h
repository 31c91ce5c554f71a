#pragma once
// Weight packing and the linear layer y = x W^T (+ bias), the kernels' hot op.
//
// pack_weight() converts a row-major [rows][cols] weight (HF layout) once, at load time, into
// PackedWeight: panels of 16 output rows whose layout suits every ISA path (see
// docs/kernels.md). matmul() picks, from active_isa() and the number of tokens, a
// bandwidth-bound GEMV path (few tokens) or a register-blocked GEMM (many tokens).
//
// Ownership: PackedWeight owns its 64-byte aligned storage and is movable, not copyable.
// Thread-safety: a PackedWeight is immutable after packing; matmul() may run concurrently on
// the same weight with different pools.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/weight_memory.h"

namespace crescent::kernels {

// kF32 / kBF16 / kQ8_0 are repacked into panels (below); the ggml block formats (kQ4_0 ...
// kQ6_K, kIQ4_NL) keep the file's bytes: each row is its ggml blocks, 16 rows per panel.
enum class WeightFormat {
  kF32,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_NL,
};
std::string_view weight_format_name(WeightFormat format);
// The ggml block type a format stores its rows in (nullopt for the panel formats).
std::optional<DType> ggml_row_dtype(WeightFormat format);
// The format that computes directly on weights stored as `dtype` (kQ8_0 for Q8_0, the ggml row
// format for the other block types, nullopt for the float types).
std::optional<WeightFormat> native_weight_format(DType dtype);

// Rows per packed panel (one 512-bit vector of float outputs).
constexpr int64_t kPanelRows = 16;

class PackedWeight {
 public:
  PackedWeight() = default;
  PackedWeight(PackedWeight&&) noexcept = default;
  PackedWeight& operator=(PackedWeight&&) noexcept = default;
  PackedWeight(const PackedWeight&) = delete;
  PackedWeight& operator=(const PackedWeight&) = delete;

  int64_t rows() const { return rows_; }  // output features
  int64_t cols() const { return cols_; }  // input features
  WeightFormat format() const { return format_; }
  int64_t num_bytes() const { return num_bytes_; }

  // Layout details for the kernels.
  int64_t num_panels() const { return (rows_ + kPanelRows - 1) / kPanelRows; }
  // cols rounded up: to 2 for F32/BF16 (K pairs), to 32 for Q8_0 (blocks).
  int64_t padded_cols() const { return padded_cols_; }
  int64_t panel_stride_bytes() const { return panel_stride_bytes_; }
  const std::byte* panel(int64_t p) const { return data_.get() + p * panel_stride_bytes_; }
  // ggml row formats: bytes of one row; row r is at panel(r / 16) + (r % 16) * row_bytes(),
  // unless is_x16().
  int64_t row_bytes() const { return row_bytes_; }
  // The legacy block types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) and Q4_K / Q5_K / Q6_K packed where
  // the active kernel table has their x16 GEMV (AVX512-BF16 + VNNI): each panel's rows
  // interleaved block by block (x16.h). Same bytes.
  bool is_x16() const { return x16_; }
  std::byte* mutable_panel(int64_t p) { return data_.get() + p * panel_stride_bytes_; }

  // An all-zero weight with storage for the given shape (weight_memory.h says where from).
  static PackedWeight allocate(int64_t rows, int64_t cols, WeightFormat format,
                               WeightStorage storage = WeightStorage::kModel);

 private:
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t padded_cols_ = 0;
  int64_t panel_stride_bytes_ = 0;
  int64_t num_bytes_ = 0;
  int64_t row_bytes_ = 0;
  WeightFormat format_ = WeightFormat::kF32;
  bool x16_ = false;
  std::shared_ptr<std::byte> data_;  // allocate_weight_memory (weight_memory.h)

  friend Result<PackedWeight> pack_weight(const void* data, DType dtype, int64_t rows, int64_t cols,
                                          WeightFormat format, WeightStorage storage);
};

// Packs `data` (row-major [rows][cols] of `dtype`; block-quantised sources need cols to be a
// multiple of their block size) into `format`. Float sources packed to kQ8_0 are quantised like
// ggml (per 32 values, d = max|x| / 127, q = round(x / d)); a source already in the format's
// block type keeps its exact bits; other sources are dequantised and requantised with ggml's
// reference quantiser (quants.h). The ggml row formats need cols % block size == 0.
// kTransient storage is for weights packed per request (weight_memory.h).
Result<PackedWeight> pack_weight(const void* data, DType dtype, int64_t rows, int64_t cols,
                                 WeightFormat format,
                                 WeightStorage storage = WeightStorage::kModel);

// Panel p of a ggml row format as the file lays its 16 rows out (row r's blocks at
// r * row_bytes()), whatever the stored layout: bytes that do not depend on the CPU.
std::vector<std::byte> panel_file_rows(const PackedWeight& w, int64_t p);

// The weight as row-major [rows][cols] floats (exact: dequantised values for Q8_0).
std::vector<float> unpack_weight(const PackedWeight& w);

// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < num_tokens; x, y float32 row-major and
// not aliased.
// Each output element is computed by one thread in a fixed order, so results do not depend on
// the pool's thread count.
void matmul(const float* x, int64_t num_tokens, const PackedWeight& w, const float* bias, float* y,
            ThreadPool& pool);

// Fewer tokens than this use the GEMV path (weights streamed once, f32 math) even where an F32 /
// BF16 GEMM exists.
constexpr int64_t kGemmMinTokens = 4;

}  // namespace crescent::kernels
