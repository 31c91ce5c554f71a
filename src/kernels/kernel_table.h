#pragma once
// Internal to src/kernels: the per-ISA function table the public ops dispatch through. Each
// kernels_<isa>.cc file fills in the entries it implements; the table for an ISA is the
// portable one overwritten by every level up to it (so a missing entry falls back downwards).
//
// Thread-safety: tables are built once and immutable.

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace crescent::kernels::internal {

// One weight row of a ggml block type (num_values values) dotted with the quantised activations
// of num_tokens (1..kMaxDotTokens) tokens: out[t] = sum_i w[i] * x[t][i].
constexpr int kMaxDotTokens = 4;
using RowDotFn = void (*)(int64_t num_values, const void* w_row, const QuantizedActs* x,
                          int num_tokens, float* out);
// Activations prepared once per matmul() call; the panel kernels read the form they need.
struct MatmulArgs {
  const PackedWeight* w = nullptr;
  int64_t num_tokens = 0;
  const float* x = nullptr;  // [num_tokens][padded_cols] f32, zero padded
  // BF16 pairs (lo = even column) in GEMM order: [token block][pair][kBf16GemmTokens], the
  // tokens past num_tokens zero, so the microkernel broadcasts from one moving pointer.
  const uint32_t* x_bf16 = nullptr;
  // f32 in the FMA GEMM's order: [token block][padded column][kF32GemmTokens], the tokens past
  // num_tokens zero.
  const float* x_blocked = nullptr;
  // [num_tokens][padded_cols] int8 quants: Q8_0's, or for the ggml GEMM over K-quant weights
  // Q8_K's (scales in x_block_scale).
  const int8_t* xq = nullptr;
  const float* x_scale = nullptr;  // [num_tokens][padded_cols / 32] Q8_0 scales
  const int32_t* x_sum = nullptr;  // [num_tokens][padded_cols / 32] sum of the quants per block
  // [num_tokens][padded_cols / 256] for K-quant weights' row dots and GEMVs (not the GEMM's).
  const BlockQ8K* x_q8k = nullptr;
  RowDotFn row_dot = nullptr;  // ggml row formats
  // The ggml GEMM (prefill) over xq: per token, the activation scale of each activation block
  // (256 values for the K-quants' Q8_K, 32 for Q8_0: [num_tokens][padded_cols / block]), and per
  // token and weight scale group ([num_tokens][padded_cols / group_size]) the sum of its quants
  // in the form the GEMM's tile reads with one broadcast load: for the types whose panels store
  // q + bias (ggml_gemm_bias), -bias * sum, where the group's int32 dot starts; for the types
  // with a min, the sum as a float, which the group's offset multiplies. The other is null.
  const float* x_block_scale = nullptr;
  const int32_t* x_group_start = nullptr;
  const float* x_group_sum = nullptr;
  int group_size = 0;
  const float* bias = nullptr;  // [rows] or null
  float* y = nullptr;           // [num_tokens][rows]
};
// Tokens per BF16 GEMM microkernel call (2 panels x 12 tokens = 24 zmm accumulators).
constexpr int64_t kBf16GemmTokens = 12;
// Tokens per FMA GEMM microkernel call (2 panels x 8 tokens = 16 zmm accumulators).
constexpr int64_t kF32GemmTokens = 8;

constexpr int kNumDTypes = static_cast<int>(DType::kIQ4_NL) + 1;

// Writes y for every token and every row of panels [panel_begin, panel_end).
using MatmulPanelsFn = void (*)(const MatmulArgs& args, int64_t panel_begin, int64_t panel_end);

// The largest head dimension attend_rows takes.
constexpr int64_t kMaxTileDim = 256;

// Causal attention of num_q query rows against one KV head's keys and values (bf16, or f16 where
// f16 is set): key j is row j % block_size of blocks k_blocks[j / block_size] and
// v_blocks[j / block_size] (rows `stride` elements apart); query row i sees keys [0, visible[i])
// (1 <= visible[i] <= num_keys) and gets out[i] = softmax(scale * q[i] . K) V over them. dim: a
// multiple of 16 up to kMaxTileDim.
struct AttendRowsArgs {
  const float* const* q = nullptr;
  float* const* out = nullptr;
  const int* visible = nullptr;
  int num_q = 0;
  const uint16_t* const* k_blocks = nullptr;
  const uint16_t* const* v_blocks = nullptr;
  int block_size = 0;
  int64_t num_keys = 0;
  int64_t stride = 0;
  int64_t dim = 0;
  float scale = 0;
  bool f16 = false;  // K/V in f16 rather than bf16
};

struct KernelTable {
  MatmulPanelsFn matmul_f32 = nullptr;     // F32 weights, f32 math
  MatmulPanelsFn matmul_bf16 = nullptr;    // BF16 weights widened to f32, f32 math
  MatmulPanelsFn gemm_bf16_dot = nullptr;  // BF16 weights x BF16 activations, f32 accumulate
  // Many tokens, f32 FMAs over x_blocked: F32 weights, and BF16 weights widened in registers
  // (used where bf16_gemm_uses_dot() says no or gemm_bf16_dot is null).
  MatmulPanelsFn gemm_f32 = nullptr;
  MatmulPanelsFn gemm_bf16_fma = nullptr;
  MatmulPanelsFn matmul_q8 = nullptr;  // Q8_0 weights x Q8_0 activations, int32 block dots
  // The same for kQ8GemmMinTokens or more: the ggml GEMM's tile over unpacked panels, with the
  // activations in its form (x_group_start, x_block_scale).
  MatmulPanelsFn gemm_q8 = nullptr;
  // ggml block types (indexed by DType) x their activation partner, int32 block dots.
  RowDotFn row_dot[kNumDTypes] = {};
  // ggml block types other than Q8_0, many tokens: panels unpacked once per call (gemm_ggml_*.cc).
  MatmulPanelsFn gemm_ggml = nullptr;
  // The legacy block types stored x16-interleaved (legacy_x16.h), few tokens. Where it is set,
  // pack_weight stores those types interleaved; every table still computes on such weights.
  MatmulPanelsFn gemv_legacy_x16 = nullptr;
  // The same for Q4_K, Q5_K and Q6_K (kquant_x16.h).
  MatmulPanelsFn gemv_kquant_x16 = nullptr;
  float (*dot)(const float* a, const float* b, int64_t n) = nullptr;
  void (*axpy)(float a, const float* x, float* y, int64_t n) = nullptr;  // y += a * x
  // The same over bf16 b / x (the bf16 KV cache), widened to f32 in registers.
  float (*dot_bf16)(const float* a, const uint16_t* b, int64_t n) = nullptr;
  void (*axpy_bf16)(float a, const uint16_t* x, float* y, int64_t n) = nullptr;
  // Attention over one KV block of n rows `stride` elements apart (bf16 KV cache), with the
  // per-row call, the output row's loads and stores, and the scaling folded into one call:
  // out[j] = scale * dot(a, rows[j]); y += sum_j p[j] * rows[j].
  void (*dot_rows_bf16)(const float* a, const uint16_t* rows, int64_t stride, int n, int64_t dim,
                        float scale, float* out) = nullptr;
  void (*axpy_rows_bf16)(const float* p, const uint16_t* rows, int64_t stride, int n, int64_t dim,
                         float* y) = nullptr;
  // A prefill task's query rows over all of their keys at once (AttendRowsArgs): each chunk of
  // keys is widened once for every row, and the rows share register tiles, which is what makes
  // prefill attention cheap. null: paged_attention's per-row loop.
  void (*attend_rows)(const AttendRowsArgs& args) = nullptr;
  // The other stored KV types (kv_convert.h): f16, fp8_e4m3 and q8_0 (n a multiple of 32).
  float (*dot_f16)(const float* a, const uint16_t* b, int64_t n) = nullptr;
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n) = nullptr;
  float (*dot_fp8)(const float* a, const uint8_t* b, int64_t n) = nullptr;
  void (*axpy_fp8)(float a, const uint8_t* x, float* y, int64_t n) = nullptr;
  float (*dot_q8_0)(const float* a, const Q8Block* b, int64_t n) = nullptr;
  void (*axpy_q8_0)(float a, const Q8Block* x, float* y, int64_t n) = nullptr;
  void (*scale)(float a, float* y, int64_t n) = nullptr;  // y *= a
  void (*rms_norm)(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
                   float* y) = nullptr;
  void (*add_inplace)(float* y, const float* x, int64_t n) = nullptr;
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out) = nullptr;
  // x[i] = exp(x[i] * scale - shift) in place; returns the sum of the new x.
  float (*exp_sum)(float* x, int64_t n, float scale, float shift) = nullptr;
  // The largest x[i], NaN ignored; -inf when there is none (n >= 0).
  float (*max_value)(const float* x, int64_t n) = nullptr;
  // quantize_row_q8_k (quants.h), the same bits as its scalar reference; null: that reference.
  void (*quantize_q8_k)(const float* x, int64_t num_values, BlockQ8K* out) = nullptr;
  // quantize_row_q8 (below), the same bits as its scalar reference; null: that reference.
  void (*quantize_q8)(const float* x, int64_t n, int8_t* quants, float* scales,
                      int32_t* sums) = nullptr;
  // Register-only multiply-add loops for the peak baselines; return the flops done.
  double (*peak_fma_flops)(int64_t num_iters) = nullptr;
  double (*peak_bf16_flops)(int64_t num_iters) = nullptr;  // null without AVX512-BF16
  double (*peak_int8_ops)(int64_t num_iters) = nullptr;    // vpdpbusd; null without VNNI
};

// Whether BF16 weights' GEMM runs on gemm_bf16_dot (vdpbf16ps) rather than gemm_bf16_fma: where
// the table has it and bf16_gemm_uses_dot() says so, or where the table has no FMA GEMM.
inline bool runs_bf16_dot(const KernelTable& t) {
  return t.gemm_bf16_dot != nullptr && (bf16_gemm_uses_dot() || t.gemm_bf16_fma == nullptr);
}

// A stored element as f32: the scalar tails of the kernels over f32 or bf16 (uint16_t) data.
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t x) {
  return bf16_to_float(x);
}

void fill_portable(KernelTable* table);
void fill_avx2(KernelTable* table);
void fill_avx512(KernelTable* table);
void fill_attention_avx2(KernelTable* table);
void fill_attention_avx512(KernelTable* table);
void fill_avx512bf16(KernelTable* table);
void fill_gemm_f32_avx2(KernelTable* table);
void fill_gemm_f32_avx512(KernelTable* table);
// The ggml block types' row dots (quant_dot_<isa>.cc).
void fill_quant_portable(KernelTable* table);
void fill_quant_avx2(KernelTable* table);
void fill_gemm_ggml_avx512vnni(KernelTable* table);
void fill_gemv_legacy_x16_avx512vnni(KernelTable* table);
void fill_gemv_kquant_x16_avx512vnni(KernelTable* table);
// The f16 / fp8_e4m3 / q8_0 KV loads of attention (kv_dot_<isa>.cc).
void fill_kv_portable(KernelTable* table);
void fill_kv_avx2(KernelTable* table);
void fill_kv_avx512(KernelTable* table);

const KernelTable& kernel_table(Isa isa);
inline const KernelTable& active_table() {
  return kernel_table(active_isa());
}
// The table's x16 GEMV for weights stored as `dtype` (null: the type stays in the file's rows).
MatmulPanelsFn x16_gemv(const KernelTable& table, DType dtype);

// Values per scale group in the ggml GEMM's unpacked panels: the type's sub-block (16 for Q2_K,
// Q3_K and Q6_K, 32 for Q4_K and Q5_K) or the legacy types' whole block of 32.
constexpr int ggml_gemm_group_size(DType dtype) {
  return dtype == DType::kQ2_K || dtype == DType::kQ3_K || dtype == DType::kQ6_K ? 16 : 32;
}
// What the ggml GEMM's unpacked panels add to a type's quants to make them unsigned for vpdpbusd
// (0: the quants are unsigned already, and the type has a min instead).
constexpr int ggml_gemm_bias(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return 8;
    case DType::kQ5_0:
      return 16;
    case DType::kQ3_K:
      return 4;
    case DType::kQ6_K:
      return 32;
    case DType::kIQ4_NL:
    case DType::kQ8_0:  // the Q8_0 format's panels (kernel_table.h), not a ggml row type
      return 128;
    default:
      return 0;
  }
}
// Fewer tokens than this take the row dots: unpacking the panels costs about one pass over the
// weight, which 4 tokens (one pass of the row dots) do not repay; from 5 tokens (two passes) on
// the GEMM wins (Q5_0 5-7 tokens: about half the time).
constexpr int64_t kGgmlGemmMinTokens = 5;
// The x16 GEMVs (x16.h) share each block's unpacking across 4 tokens, so two passes over
// the weight (5-8 tokens) still beat the GEMM's unpacked panels: Q4_K_M decode at batch 6 / 8,
// 2 threads, 5-10% more tokens/s; at batch 16 (four passes) the GEMM wins by ~5-10%.
constexpr int64_t kX16GemmMinTokens = 9;
// Q8_0's GEMV kernel reads the panels as stored, with no unpacking to repay: the GEMM's tile
// (gemm_q8) wins at 512 tokens (+20-30%, bench kernels), is within noise at 16-64 and behind at
// 5-8.
constexpr int64_t kQ8GemmMinTokens = 32;

// Batch-1 decode reads each weight byte once, in order, and the hardware prefetchers alone held
// the quantised GEMVs to ~22 GB/s on two threads of an Intel Xeon VM that streams ~30 with
// software prefetch (llama-3.2-1b batch-1 decode 22 -> 30 tokens/s Q4_K_M, 17 -> 24 Q6_K). So
// each GEMV asks for the bytes kGemvPrefetchBytes ahead of the `n` it starts on: at a panel's
// end those are the next panel's (a thread's panels are contiguous), past the weight's end they
// are ignored (a prefetch never faults).
constexpr int64_t kGemvPrefetchBytes = 8192;
inline void prefetch_ahead_of(const void* p, int64_t n) {
  for (int64_t off = 0; off < n; off += 64) {
    __builtin_prefetch(static_cast<const char*>(p) + kGemvPrefetchBytes + off);
  }
}

// Q8_0 activation quantisation (ggml's quantize_row_q8_0; the scale rounded to f16 as its
// block_q8_0 stores it, returned as f32): n % 32 == 0. Runs the table's quantize_q8 where the
// ISA level has one.
void quantize_row_q8(const float* x, int64_t n, int8_t* quants, float* scales, int32_t* sums);

// A Q8_0 block's scale from its largest magnitude: `inverse` multiplies the values into quants,
// `stored` is what the block keeps (d rounded to f16, as ggml's block_q8_0; a d past f16's range,
// activations above ~8e6, keeps its f32 value instead of inf). A block of values below ~4e-37
// (d denormal, 1 / d overflows) gets 0 for both. Shared by quantize_row_q8 and its vector forms
// so that they agree bit for bit.
struct Q8Scale {
  float stored;
  float inverse;
};
inline Q8Scale q8_scale_for(float amax) {
  float d = amax / 127.0f;
  float id = d != 0 ? 1.0f / d : 0.0f;
  if (!std::isfinite(id)) {
    d = 0;
    id = 0;
  }
  const float d16 = f16_to_float(float_to_f16(d));
  return {std::isfinite(d16) ? d16 : d, id};
}
// The reference's rounding of v = x * inverse to an integer: v + 1.5 * 2^23, then the mantissa
// (ggml's nearest_int): nearest, ties to even, for |v| <= 127; a NaN gives its mantissa's low
// bits. The product must be rounded to float before the add (matmul.cc is built for the baseline
// ISA, which has no FMA to contract them into).
constexpr float kQ8RoundMagic = 12582912.0f;  // 1.5 * 2^23

// Q8_0 panel layout (see docs/kernels.md): 32-column blocks in pairs, pair g at g * kQ8PairBytes:
// the 16 rows' f16 scales of blocks 2g and 2g + 1 (32 bytes each), then the two blocks' quants
// (512 bytes each, [column run j][row][4 bytes], u8 = q + 128). One 64-byte-aligned stream per
// panel: decode reads each block's scales beside its quants, not from a second region.
constexpr int64_t kQ8BlockQuantBytes = 32 * kPanelRows;
constexpr int64_t kQ8PairBytes = 2 * (kPanelRows * 2) + 2 * kQ8BlockQuantBytes;
constexpr int64_t q8_scales_offset(int64_t block) {
  return block / 2 * kQ8PairBytes + block % 2 * (kPanelRows * 2);
}
constexpr int64_t q8_quants_offset(int64_t block) {
  return block / 2 * kQ8PairBytes + 4 * kPanelRows + block % 2 * kQ8BlockQuantBytes;
}
// Bytes of one panel's blocks (a final odd block takes its pair's scale line and its quants).
constexpr int64_t q8_panel_bytes(int64_t padded_cols) {
  const int64_t num_blocks = padded_cols / 32;
  return num_blocks / 2 * kQ8PairBytes + num_blocks % 2 * (4 * kPanelRows + kQ8BlockQuantBytes);
}

}  // namespace crescent::kernels::internal
