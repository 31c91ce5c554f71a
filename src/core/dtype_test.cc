#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace crescent {
namespace {

TEST(DTypeTest, Bf16RoundTripsAndRoundsToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 0x1p-70f, 65536.0f}) {
    EXPECT_EQ(bf16_to_float(float_to_bf16(f)), f) << f;
  }
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t exp = (h >> 10) & 0x1f;
    if (exp == 31)
      continue;  // inf/nan
    float f = f16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_to_f16(f), h) << std::hex << h << " " << f;
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
}

TEST(DTypeTest, ByteCounts) {
  EXPECT_EQ(dtype_num_bytes(DType::kBF16, 10), 20);
  EXPECT_EQ(dtype_num_bytes(DType::kQ8_0, 64), 68);
}

}  // namespace
}  // namespace crescent
