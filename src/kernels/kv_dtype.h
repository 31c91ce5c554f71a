#pragma once
// The element type of the paged KV cache, and `--kv-cache-dtype` (vLLM's flag name) parsed into
// it. float32 is exact; bf16 (round to nearest even from the f32 K/V) halves the cache and the
// bytes a disaggregated request moves, and attention widens it to f32 in registers.

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace crescent::kernels {

enum class KvDtype { kFloat32, kBf16 };

constexpr int64_t kv_dtype_bytes(KvDtype dtype) {
  return dtype == KvDtype::kBf16 ? 2 : 4;
}
// "float32" or "bf16": the flag's spelling, also what P/D peers compare.
std::string_view kv_dtype_name(KvDtype dtype);

// What `auto` means on this CPU: bf16 when the active ISA is AVX2 or better (the attention
// kernels widen bf16 in registers there), else float32.
KvDtype auto_kv_dtype();

// Parses a --kv-cache-dtype value: auto, float32 (or fp32/f32) or bf16. f16, fp8_e4m3 and
// q8_0 (issue 14) are refused as not implemented yet, never mapped to another type.
Result<KvDtype> parse_kv_dtype(std::string_view name);

}  // namespace crescent::kernels
