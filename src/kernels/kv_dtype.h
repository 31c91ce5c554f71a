#pragma once
// The element type of the paged KV cache, and `--kv-cache-dtype` (vLLM's flag name) parsed into
// it. float32 is exact; bf16 and f16 (round to nearest even) halve the cache, fp8_e4m3 (OCP
// E4M3FN, scale 1.0, saturating at +-448) and q8_0 (ggml's block: fp16 scale + 32 int8 along
// head_dim) about quarter it. Attention widens every type to f32 in registers
// (kernels/kv_convert.h has the conversions).

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace crescent::kernels {

enum class KvDtype { kFloat32, kBf16, kF16, kFp8E4m3, kQ8_0 };

// Bytes of one stored head row of head_dim values (q8_0: head_dim / 32 blocks of 34 bytes;
// head_dim must then be a multiple of 32, which check_kv_dtype enforces at startup).
constexpr int64_t kv_row_bytes(KvDtype dtype, int64_t head_dim) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return 4 * head_dim;
    case KvDtype::kBf16:
    case KvDtype::kF16:
      return 2 * head_dim;
    case KvDtype::kFp8E4m3:
      return head_dim;
    case KvDtype::kQ8_0:
      return head_dim / 32 * 34;
  }
  return 0;
}
// "float32", "bf16", "f16", "fp8_e4m3" or "q8_0": the flag's spelling, also what P/D peers
// compare.
std::string_view kv_dtype_name(KvDtype dtype);

// What `auto` means on this CPU: bf16 when the active ISA is AVX2 or better (the attention
// kernels widen bf16 in registers there), else float32.
KvDtype auto_kv_dtype();

// Parses a --kv-cache-dtype value: auto, float32 (or fp32/f32), bf16, f16 (or fp16/float16),
// fp8_e4m3 (or fp8) or q8_0. fp8_e5m2 is refused, never mapped to another type.
Result<KvDtype> parse_kv_dtype(std::string_view name);

// InvalidArgument naming --kv-cache-dtype and head_dim when `dtype` cannot store rows of
// head_dim values (q8_0 needs a multiple of 32).
Status check_kv_dtype(KvDtype dtype, int64_t head_dim);

}  // namespace crescent::kernels
