#pragma once
// Element types of weights and tensors as they appear in model files, and exact conversions
// between them and float. Q8_0 is GGUF's block format: 32 int8 values sharing one F16 scale.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace crescent {

enum class DType { kF32, kF16, kBF16, kQ8_0 };

constexpr int64_t kQ8BlockSize = 32;
// One Q8_0 block: F16 scale followed by 32 int8 quants (34 bytes), as in GGUF.
struct Q8Block {
  uint16_t scale_f16;
  int8_t quants[kQ8BlockSize];
};
static_assert(sizeof(Q8Block) == 34);

std::string_view dtype_name(DType dtype);

// Bytes taken by num_elements values (num_elements must be a multiple of 32 for Q8_0).
constexpr int64_t dtype_num_bytes(DType dtype, int64_t num_elements) {
  switch (dtype) {
    case DType::kF32:
      return num_elements * 4;
    case DType::kF16:
    case DType::kBF16:
      return num_elements * 2;
    case DType::kQ8_0:
      return num_elements / kQ8BlockSize * static_cast<int64_t>(sizeof(Q8Block));
  }
  return 0;
}

inline float bf16_to_float(uint16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffff) > 0x7f800000)
    return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Converts num_elements values of `dtype` at data to float (a multiple of 32 for Q8_0).
void dtype_to_float(DType dtype, const void* data, int64_t num_elements, float* out);

}  // namespace crescent
