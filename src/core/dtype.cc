#include "core/dtype.h"

#include <cmath>
#include <cstring>

namespace crescent {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
  }
  return "?";
}

float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000)
    return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000)
    return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (abs < 0x38800000) {                         // subnormal or zero in f16
    float a = std::bit_cast<float>(abs);
    // 2^-24 is the f16 subnormal unit; nearbyint rounds half to even.
    auto m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

void dtype_to_float(DType dtype, const void* data, int64_t num_elements, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, data, static_cast<size_t>(num_elements) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < num_elements; ++i) {
        out[i] = f16_to_float(p[i]);
      }
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < num_elements; ++i) {
        out[i] = bf16_to_float(p[i]);
      }
      return;
    }
    case DType::kQ8_0: {
      const auto* blocks = static_cast<const Q8Block*>(data);
      for (int64_t b = 0; b < num_elements / kQ8BlockSize; ++b) {
        float scale = f16_to_float(blocks[b].scale_f16);
        for (int64_t i = 0; i < kQ8BlockSize; ++i) {
          out[b * kQ8BlockSize + i] = scale * static_cast<float>(blocks[b].quants[i]);
        }
      }
      return;
    }
  }
}

}  // namespace crescent
