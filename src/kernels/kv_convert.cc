#include "kernels/kv_convert.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/quants.h"

namespace crescent::kernels {
namespace {

std::array<float, 256> build_fp8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 15;
    const int m = b & 7;
    float v;
    if (e == 15 && m == 7)
      v = std::numeric_limits<float>::quiet_NaN();
    else if (e == 0)
      v = std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
    else
      v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}

}  // namespace

const float* fp8_e4m3_table() {
  static const std::array<float, 256> table = build_fp8_table();
  return table.data();
}

uint8_t float_to_fp8_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000)
    return sign | 0x7f;  // NaN
  if (abs >= 0x43e00000)
    return sign | 0x7e;    // >= 448 (and inf): saturate
  if (abs < 0x3c800000) {  // below 2^-6: subnormal in e4m3 (unit 2^-9), half to even
    const float a = std::bit_cast<float>(abs);
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // 8 carries into e = 1
  }
  // Round the 23-bit mantissa to 3 bits, half to even, then rebias 127 -> 7.
  const uint32_t rounded = abs + 0x7ffff + ((abs >> 20) & 1);
  const uint32_t bits = (rounded >> 20) - (120u << 3);
  return sign | static_cast<uint8_t>(bits > 0x7e ? 0x7e : bits);
}

void store_kv_row(KvDtype dtype, const float* src, int64_t n, void* dst) {
  switch (dtype) {
    case KvDtype::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDtype::kBf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i)
        d[i] = float_to_bf16(src[i]);
      return;
    }
    case KvDtype::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i)
        d[i] = float_to_f16(src[i]);
      return;
    }
    case KvDtype::kFp8E4m3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i)
        d[i] = float_to_fp8_e4m3(src[i]);
      return;
    }
    case KvDtype::kQ8_0:
      CRESCENT_CHECK(n % kQ8BlockSize == 0) << "q8_0 row of " << n << " values";
      quantize_row(DType::kQ8_0, src, n, dst);
      return;
  }
}

void load_kv_row(KvDtype dtype, const void* src, int64_t n, float* dst) {
  switch (dtype) {
    case KvDtype::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDtype::kBf16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      return;
    case KvDtype::kF16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = f16_to_float(static_cast<const uint16_t*>(src)[i]);
      return;
    case KvDtype::kFp8E4m3:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = fp8_e4m3_to_float(static_cast<const uint8_t*>(src)[i]);
      return;
    case KvDtype::kQ8_0: {
      const auto* b = static_cast<const Q8Block*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const Q8Block& blk = b[i / kQ8BlockSize];
        dst[i] = f16_to_float(blk.scale_f16) * static_cast<float>(blk.quants[i % kQ8BlockSize]);
      }
      return;
    }
  }
}

}  // namespace crescent::kernels
