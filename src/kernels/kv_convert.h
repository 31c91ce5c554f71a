#pragma once
// Scalar conversions between f32 and the stored KV types (kv_dtype.h): what write_kv stores and
// the reference the vectorised attention loads are tested against.
//
// fp8_e4m3 is OCP E4M3FN as PyTorch's float8_e4m3fn and vLLM's fp8 KV cache: 1 sign, 4 exponent
// bits (bias 7), 3 mantissa bits, no infinities, NaN = 0x7f / 0xff, largest finite 448. Stores
// use a per-tensor scale of 1.0 (vLLM's default), round to nearest even and saturate: finite
// values and infinities beyond +-448 become +-448; NaN stays NaN.

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace crescent::kernels {

uint8_t float_to_fp8_e4m3(float f);
// The 256 decoded values (NaN at 0x7f and 0xff), for loads by table lookup or gather.
const float* fp8_e4m3_table();
inline float fp8_e4m3_to_float(uint8_t b) {
  return fp8_e4m3_table()[b];
}

// Stores n values of src (one head row; n a multiple of 32 for q8_0) as `dtype` at dst
// (kv_row_bytes(dtype, n) bytes): f16 and bf16 round to nearest even, q8_0 is ggml's
// quantize_row_q8_0_ref (d = amax / 127, q = round(x / d)).
void store_kv_row(KvDtype dtype, const float* src, int64_t n, void* dst);
// Widens a stored row back to f32 (scalar).
void load_kv_row(KvDtype dtype, const void* src, int64_t n, float* dst);

}  // namespace crescent::kernels
