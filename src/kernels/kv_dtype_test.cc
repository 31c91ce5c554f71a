// The KV cache types: --kv-cache-dtype parsing, f32 <-> stored conversions against scalar
// references written from the formats' definitions, and each ISA's dot / axpy over stored rows.

#include "kernels/kv_dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/isa.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"
#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::ScopedIsa;

TEST(KvDtypeTest, ParsesTheFlag) {
  EXPECT_EQ(*parse_kv_dtype("float32"), KvDtype::kFloat32);
  EXPECT_EQ(*parse_kv_dtype("bf16"), KvDtype::kBf16);
  EXPECT_EQ(*parse_kv_dtype("f16"), KvDtype::kF16);
  EXPECT_EQ(*parse_kv_dtype("fp16"), KvDtype::kF16);
  EXPECT_EQ(*parse_kv_dtype("fp8_e4m3"), KvDtype::kFp8E4m3);
  EXPECT_EQ(*parse_kv_dtype("fp8"), KvDtype::kFp8E4m3);
  EXPECT_EQ(*parse_kv_dtype("q8_0"), KvDtype::kQ8_0);
  EXPECT_EQ(*parse_kv_dtype("auto"),
            active_isa() >= Isa::kAvx2 ? KvDtype::kBf16 : KvDtype::kFloat32);
  {
    ScopedIsa portable(Isa::kPortable);
    EXPECT_EQ(*parse_kv_dtype("auto"), KvDtype::kFloat32);
  }
  Result<KvDtype> e5m2 = parse_kv_dtype("fp8_e5m2");
  ASSERT_FALSE(e5m2.is_ok());
  EXPECT_NE(e5m2.status().message().find("--kv-cache-dtype fp8_e5m2"), std::string::npos);
  EXPECT_NE(e5m2.status().message().find("not implemented"), std::string::npos);
  Result<KvDtype> bad = parse_kv_dtype("int4");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--kv-cache-dtype"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'int4'"), std::string::npos);
  for (KvDtype d :
       {KvDtype::kFloat32, KvDtype::kBf16, KvDtype::kF16, KvDtype::kFp8E4m3, KvDtype::kQ8_0}) {
    EXPECT_EQ(*parse_kv_dtype(kv_dtype_name(d)), d) << kv_dtype_name(d);
  }
}

TEST(KvDtypeTest, RowBytesAndQ8HeadDimCheck) {
  EXPECT_EQ(kv_row_bytes(KvDtype::kFloat32, 64), 256);
  EXPECT_EQ(kv_row_bytes(KvDtype::kBf16, 64), 128);
  EXPECT_EQ(kv_row_bytes(KvDtype::kF16, 64), 128);
  EXPECT_EQ(kv_row_bytes(KvDtype::kFp8E4m3, 64), 64);
  EXPECT_EQ(kv_row_bytes(KvDtype::kQ8_0, 128), 4 * 34);
  EXPECT_TRUE(check_kv_dtype(KvDtype::kQ8_0, 64).is_ok());
  EXPECT_TRUE(check_kv_dtype(KvDtype::kFp8E4m3, 12).is_ok());
  Status s = check_kv_dtype(KvDtype::kQ8_0, 80);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("--kv-cache-dtype q8_0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("head_dim is 80"), std::string::npos) << s.message();
}

// E4M3FN from its definition: s eeee mmm, bias 7, subnormals at e = 0, NaN at e = 15, m = 7.
double fp8_reference(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7)
    return NAN;
  const double mag =
      e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

TEST(KvFp8Test, TableValuesSaturationAndNan) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(fp8_e4m3_to_float(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
  for (int b = 0; b < 256; ++b) {
    const double ref = fp8_reference(static_cast<uint8_t>(b));
    const float got = fp8_e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      EXPECT_EQ(float_to_fp8_e4m3(got) & 0x7f, 0x7f) << b;
      continue;
    }
    ASSERT_EQ(got, static_cast<float>(ref)) << b;
    // Every finite value round-trips (0x80, -0, maps to itself too).
    ASSERT_EQ(float_to_fp8_e4m3(got), b) << b;
  }
  // Saturation: beyond +-448, infinities included; NaN stays NaN.
  for (float f : {449.0f, 464.0f, 480.0f, 1e6f, INFINITY})
    EXPECT_EQ(float_to_fp8_e4m3(f), 0x7e) << f;
  for (float f : {-449.0f, -1e6f, -INFINITY})
    EXPECT_EQ(float_to_fp8_e4m3(f), 0xfe) << f;
  EXPECT_EQ(float_to_fp8_e4m3(NAN) & 0x7f, 0x7f);
  // Round to nearest, ties to even: 1 + 1/16 lies halfway between 1 (m 0) and 1.125 (m 1).
  EXPECT_EQ(float_to_fp8_e4m3(1.0f + 0x1p-4f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(1.125f + 0x1p-4f), 0x3a);  // between m 1 and m 2: to m 2
  EXPECT_EQ(float_to_fp8_e4m3(0x1p-10f), 0x00);          // half the smallest subnormal: to 0
  EXPECT_EQ(float_to_fp8_e4m3(0x1.8p-9f), 0x02);         // 1.5 units: to even (2)
  // Nearest: against the table, for many values in range.
  for (float f : random_floats(2000, 3, -500, 500)) {
    const uint8_t b = float_to_fp8_e4m3(f);
    const float r = fp8_e4m3_to_float(b);
    for (int c = 0; c < 256; ++c) {
      const float o = fp8_e4m3_to_float(static_cast<uint8_t>(c));
      if (!std::isnan(o) && std::fabs(f) <= 448.0f) {
        ASSERT_LE(std::fabs(r - f), std::fabs(o - f)) << f;
      }
    }
  }
}

TEST(KvF16Test, ExactForRepresentableAndNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-24f, 0x1p-14f, 1.0f + 0x1p-10f, -0.375f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(f)), f) << f;
  }
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), float_to_f16(1.0f));  // tie: to even
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 0x1.8p-11f)), 1.0f + 0x1p-10f);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  for (float f : random_floats(1000, 12)) {
    const float r = f16_to_float(float_to_f16(f));
    ASSERT_LE(std::fabs(r - f), std::max(std::fabs(f) * 0x1p-11f, 0x1p-25f)) << f;
  }
}

// ggml's quantize_row_q8_0_ref, written out: d = amax / 127, id = 1/d, q = round(x * id)
// (half away from zero), d stored as fp16.
TEST(KvQ8Test, MatchesGgmlQuantizeRowQ8_0) {
  std::vector<float> x = random_floats(128, 21, -3, 3);
  x[5] = 0;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block: d = 0, q = 0
  std::vector<Q8Block> stored(4);
  store_kv_row(KvDtype::kQ8_0, x.data(), 128, stored.data());
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    EXPECT_EQ(stored[b].scale_f16, float_to_f16(d)) << b;
    for (int j = 0; j < 32; ++j)
      ASSERT_EQ(stored[b].quants[j], static_cast<int8_t>(std::round(x[b * 32 + j] * id)))
          << b << " " << j;
  }
  std::vector<float> back(128);
  load_kv_row(KvDtype::kQ8_0, stored.data(), 128, back.data());
  for (int i = 0; i < 128; ++i) {
    const Q8Block& blk = stored[i / 32];
    ASSERT_EQ(back[i], f16_to_float(blk.scale_f16) * blk.quants[i % 32]) << i;
    ASSERT_NEAR(back[i], x[i], 3.0 / 254 + 1e-3) << i;
  }
}

// The dot / axpy of every ISA over each stored type equal the f32 ones over the widened row.
TEST(KvDtypeTest, DotAndAxpyOfEveryIsaMatchWidenedF32) {
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kFp8E4m3, KvDtype::kQ8_0}) {
    for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 128}) {
      if (dtype == KvDtype::kQ8_0 && n % 32 != 0)
        continue;
      const auto a = random_floats(n, 20 + n);
      const auto b = random_floats(n, 40 + n, -4, 4);
      std::vector<std::byte> stored(static_cast<size_t>(kv_row_bytes(dtype, n)));
      store_kv_row(dtype, b.data(), n, stored.data());
      std::vector<float> wide(n);
      load_kv_row(dtype, stored.data(), n, wide.data());
      for (Isa isa : available_isas()) {
        ScopedIsa scoped(isa);
        const internal::KernelTable& t = internal::active_table();
        float d = 0;
        std::vector<float> y1(a), y2(a);
        switch (dtype) {
          case KvDtype::kF16: {
            const auto* p = reinterpret_cast<const uint16_t*>(stored.data());
            d = t.dot_f16(a.data(), p, n);
            t.axpy_f16(0.75f, p, y1.data(), n);
            break;
          }
          case KvDtype::kFp8E4m3: {
            const auto* p = reinterpret_cast<const uint8_t*>(stored.data());
            d = t.dot_fp8(a.data(), p, n);
            t.axpy_fp8(0.75f, p, y1.data(), n);
            break;
          }
          default: {
            const auto* p = reinterpret_cast<const Q8Block*>(stored.data());
            d = t.dot_q8_0(a.data(), p, n);
            t.axpy_q8_0(0.75f, p, y1.data(), n);
            break;
          }
        }
        EXPECT_NEAR(d, t.dot(a.data(), wide.data(), n), 1e-4 * (1 + n / 16))
            << kv_dtype_name(dtype) << " " << isa_name(isa) << " n " << n;
        t.axpy(0.75f, wide.data(), y2.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(y1[i], y2[i], 1e-5)
              << kv_dtype_name(dtype) << " " << isa_name(isa) << " " << n << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace crescent::kernels
