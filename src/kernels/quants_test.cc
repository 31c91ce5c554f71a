#include "kernels/quants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "kernels/matmul.h"
#include "kernels/quant_unpack.h"
#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::ScopedIsa;

const DType kTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,  DType::kQ5_0,
                        DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,  DType::kQ4_K,
                        DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL};

// Root-mean-square error of dequantize(quantize(x)) relative to the RMS of x, for values
// uniform in [-1, 1]: a uniform grid of L levels over the range gives 1 / (L - 1), and each type
// must stay within 1.2x that for its number of levels (2^bits; 255 for Q8_0).
double rel_rmse_bound(DType t) {
  int bits = 0;
  switch (t) {
    case DType::kQ8_0:
      bits = 8;
      break;
    case DType::kQ6_K:
      bits = 6;
      break;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ5_K:
      bits = 5;
      break;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kIQ4_NL:
      bits = 4;
      break;
    case DType::kQ3_K:
      bits = 3;
      break;
    case DType::kQ2_K:
      bits = 2;
      break;
    default:
      break;
  }
  return 1.2 / ((1 << bits) - 1);
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_num_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), static_cast<int64_t>(x.size()), q.data());
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(n);
  dtype_to_float(t, q.data(), n, y.data());
  return y;
}

TEST(QuantsTest, RoundTripWithinTheTypesErrorBound) {
  const int64_t n = 256 * 64;
  for (DType t : kTypes) {
    // Uniform values, and a row with a large outlier per block of 256 and an all-zero stretch.
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<float> x = random_floats(n, 7 + variant);
      if (variant == 1) {
        for (int64_t i = 0; i < n; i += 256)
          x[i + 5] = 8.0f;
        for (int64_t i = 512; i < 1024; ++i)
          x[i] = 0.0f;
      }
      const std::vector<float> y = dequantize(t, quantize(t, x), n);
      double err2 = 0;
      double sum2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        err2 += (x[i] - y[i]) * (x[i] - y[i]);
        sum2 += x[i] * x[i];
        if (x[i] == 0.0f && variant == 1 && i >= 512 && i < 1024) {
          ASSERT_NEAR(y[i], 0.0f, 1e-6) << dtype_name(t) << " zero block";
        }
      }
      const double rel = std::sqrt(err2 / sum2);
      if (variant == 0) {
        EXPECT_LT(rel, rel_rmse_bound(t)) << dtype_name(t);
        EXPECT_GT(rel, rel_rmse_bound(t) / 20) << dtype_name(t) << ": suspiciously exact";
      } else {
        EXPECT_LT(rel, 4 * rel_rmse_bound(t)) << dtype_name(t) << " with outliers";
      }
      std::printf("%s variant %d: relative RMSE %.5f\n", std::string(dtype_name(t)).c_str(),
                  variant, rel);
    }
  }
}

// The integer view the dot kernels use (quant_unpack.h) and ggml's float dequantiser agree.
template <typename Block>
void expect_unpack_matches(DType t, const std::vector<uint8_t>& q, int64_t n) {
  const std::vector<float> ref = dequantize(t, q, n);
  const auto* blocks = reinterpret_cast<const Block*>(q.data());
  const int64_t bs = dtype_block_size(t);
  for (int64_t b = 0; b < n / bs; ++b) {
    int8_t v[256];
    if constexpr (requires(internal::KScales * s) { internal::unpack_k(blocks[b], v, s); }) {
      internal::KScales s;
      internal::unpack_k(blocks[b], v, &s);
      const int group = 256 / s.num_groups;
      for (int i = 0; i < 256; ++i) {
        const double want = static_cast<double>(s.d) * s.scale[i / group] * v[i] -
                            static_cast<double>(s.dmin) * s.min[i / group];
        ASSERT_NEAR(ref[b * 256 + i], want, 1e-6 * (std::fabs(want) + 1e-3))
            << dtype_name(t) << " block " << b << " value " << i;
      }
    } else {
      const internal::LegacyScale s = internal::unpack_legacy(blocks[b], v);
      for (int i = 0; i < 32; ++i) {
        const double want = static_cast<double>(s.d) * v[i] + s.m;
        ASSERT_NEAR(ref[b * 32 + i], want, 1e-6 * (std::fabs(want) + 1e-3))
            << dtype_name(t) << " block " << b << " value " << i;
      }
    }
  }
}

TEST(QuantsTest, IntegerUnpackMatchesDequantizer) {
  const int64_t n = 256 * 8;
  const std::vector<float> x = random_floats(n, 3);
  expect_unpack_matches<Q8Block>(DType::kQ8_0, quantize(DType::kQ8_0, x), n);
  expect_unpack_matches<BlockQ4_0>(DType::kQ4_0, quantize(DType::kQ4_0, x), n);
  expect_unpack_matches<BlockQ4_1>(DType::kQ4_1, quantize(DType::kQ4_1, x), n);
  expect_unpack_matches<BlockQ5_0>(DType::kQ5_0, quantize(DType::kQ5_0, x), n);
  expect_unpack_matches<BlockQ5_1>(DType::kQ5_1, quantize(DType::kQ5_1, x), n);
  expect_unpack_matches<BlockQ2_K>(DType::kQ2_K, quantize(DType::kQ2_K, x), n);
  expect_unpack_matches<BlockQ3_K>(DType::kQ3_K, quantize(DType::kQ3_K, x), n);
  expect_unpack_matches<BlockQ4_K>(DType::kQ4_K, quantize(DType::kQ4_K, x), n);
  expect_unpack_matches<BlockQ5_K>(DType::kQ5_K, quantize(DType::kQ5_K, x), n);
  expect_unpack_matches<BlockQ6_K>(DType::kQ6_K, quantize(DType::kQ6_K, x), n);
  expect_unpack_matches<BlockIQ4_NL>(DType::kIQ4_NL, quantize(DType::kIQ4_NL, x), n);
}

// Values on IQ4_NL's grid come back exactly: the first guess of ggml's search takes the largest
// magnitude (negative here) as level 0 and gets a negative scale; one of the 15 tries must find
// the exact 0.5, and the 0x88 bytes of an all-zero block are ggml's too.
TEST(QuantsTest, Iq4NlFindsTheExactScaleOnItsGrid) {
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; ++j)
    x[j] = 0.5f * kIQ4NLValues[(j * 7) % 16];
  const std::vector<uint8_t> q = quantize(DType::kIQ4_NL, x);
  const auto* blocks = reinterpret_cast<const BlockIQ4_NL*>(q.data());
  EXPECT_EQ(f16_to_float(blocks[0].d), 0.5f);
  EXPECT_EQ(dequantize(DType::kIQ4_NL, q, 64), x);
  EXPECT_EQ(blocks[1].d, 0);
  for (uint8_t byte : blocks[1].qs)
    EXPECT_EQ(byte, 0x88);
}

TEST(QuantsTest, Q8KActivationsFollowGgml) {
  std::vector<float> x = random_floats(512, 11);
  x[300] = -3.0f;  // the largest magnitude is negative: d = max / -127 > 0 and q = -127 there
  BlockQ8K y[2];
  quantize_row_q8_k(x.data(), 512, y);
  EXPECT_FLOAT_EQ(y[1].d, 3.0f / 127.0f);
  EXPECT_EQ(y[1].qs[300 - 256], -127);
  for (int b = 0; b < 2; ++b) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) {
        sum += y[b].qs[g * 16 + i];
        EXPECT_LE(std::fabs(y[b].qs[g * 16 + i] * y[b].d - x[b * 256 + g * 16 + i]),
                  0.5f * y[b].d * 1.0001f);
      }
      EXPECT_EQ(y[b].bsums[g], sum);
    }
  }
}

// Activations so small that 1 / scale overflows (|x| < ~4e-37, e.g. silu of a very negative
// gate) quantise as a zero block: quants and sums 0, not -2^22 per value (which overflowed the
// GEMM's -bias * sum), and the matmuls give 0.
TEST(QuantsTest, DenormalActivationBlocksQuantiseToZero) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i)
    x[i] = (i % 2 != 0 ? 1e-38f : -1e-38f) * static_cast<float>(1 + i % 5);
  std::vector<int8_t> q(64);
  std::vector<float> scale(2);
  std::vector<int32_t> sum(2);
  internal::quantize_row_q8(x.data(), 64, q.data(), scale.data(), sum.data());
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(sum[b], 0);
    EXPECT_EQ(scale[b], 0.0f);
  }
  for (int8_t v : q)
    EXPECT_EQ(v, 0);
  ThreadPool pool(2);
  const std::vector<float> wf = random_floats(17 * 64, 5);
  std::vector<float> xs(9 * 64);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = x[i % 64];
  for (DType t : {DType::kQ8_0, DType::kQ5_0, DType::kIQ4_NL}) {
    Result<PackedWeight> w = pack_weight(wf.data(), DType::kF32, 17, 64, *native_weight_format(t));
    ASSERT_TRUE(w.is_ok());
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> y(9 * 17, 1.0f);
      matmul(xs.data(), 9, *w, nullptr, y.data(), pool);
      for (float v : y)
        ASSERT_EQ(v, 0.0f) << dtype_name(t) << " on " << isa_name(isa);
    }
  }
}

// The Q8_0 activation scale is ggml's: amax / 127 rounded to f16 (its block_q8_0 field), with
// the quants from the unrounded scale; a scale past f16's range stays f32 rather than inf.
TEST(QuantsTest, Q8ActivationScaleIsRoundedToF16) {
  std::vector<float> x = random_floats(128, 23, -3, 3);
  for (int i = 64; i < 96; ++i)
    x[i] *= 1e7f;  // amax / 127 above 65504
  for (int i = 96; i < 128; ++i)
    x[i] *= 1e-5f;  // amax / 127 an f16 subnormal: the scale keeps only a few bits
  std::vector<int8_t> q(128);
  std::vector<float> scale(4);
  std::vector<int32_t> sum(4);
  internal::quantize_row_q8(x.data(), 128, q.data(), scale.data(), sum.data());
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    const float expected = b != 2 ? f16_to_float(float_to_f16(d)) : d;
    EXPECT_EQ(scale[b], expected) << "block " << b;
    if (b != 2) {
      EXPECT_NE(scale[b], d) << "random scales are not f16 values";
    }
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(q[b * 32 + i], static_cast<int8_t>(std::nearbyint(x[b * 32 + i] * (1.0f / d))));
    }
  }
}

// The vector Q8_K quantiser gives the scalar reference's bits on every ISA: random rows, a block
// whose largest magnitude appears twice with opposite signs (the first wins), ties at .5 after
// scaling, an all-zero block and one of values so small that iscale is infinite.
TEST(QuantsTest, Q8KQuantiserIsExactOnEveryIsa) {
  std::vector<float> x = random_floats(256 * 6, 17, -3, 3);
  x[256 + 10] = -4.0f;
  x[256 + 200] = 4.0f;
  for (int j = 0; j < 256; ++j)
    x[512 + j] = (static_cast<float>(j % 9) - 4.0f) * (127.0f / 254.0f);  // k + 0.5 steps
  x[512 + 3] = 127.0f / 127.0f * 4.0f;
  for (int j = 0; j < 256; ++j) {
    x[768 + j] = 0.0f;
    x[1024 + j] = (j % 3 == 0 ? -2e-38f : 1e-38f);  // iscale overflows to inf
  }
  std::vector<BlockQ8K> want(6);
  {
    ScopedIsa scoped(Isa::kPortable);
    quantize_row_q8_k(x.data(), 256 * 6, want.data());
  }
  EXPECT_EQ(want[1].qs[10], -127);  // -4 is the first largest magnitude: iscale = 127 / 4
  EXPECT_EQ(want[1].qs[200], 127);
  for (Isa isa : available_isas()) {
    ScopedIsa scoped(isa);
    std::vector<BlockQ8K> got(6);
    quantize_row_q8_k(x.data(), 256 * 6, got.data());
    for (int b = 0; b < 6; ++b) {
      EXPECT_EQ(got[b].d, want[b].d) << isa_name(isa) << " block " << b;
      EXPECT_EQ(std::memcmp(got[b].qs, want[b].qs, sizeof(want[b].qs)), 0) << isa_name(isa) << b;
      EXPECT_EQ(std::memcmp(got[b].bsums, want[b].bsums, sizeof(want[b].bsums)), 0)
          << isa_name(isa) << " block " << b;
    }
  }
}

// The vector Q8_0 quantisers give the scalar reference's bits on every ISA: random rows, ties at
// .5 after scaling, an all-zero block, one so small that 1 / d overflows, one past f16's range,
// and blocks holding inf, a default NaN and a NaN with a payload (amax ignores NaN; the quants
// of inf * 0 and of NaN are the reference's mantissa arithmetic, not a saturated conversion).
TEST(QuantsTest, Q8QuantiserIsExactOnEveryIsa) {
  constexpr int kBlocks = 10;
  std::vector<float> x = random_floats(32 * (kBlocks - 1), 29, -3, 3);
  for (int j = 0; j < 32; ++j) {
    x[32 + j] = (static_cast<float>(j % 9) - 4.0f) * (127.0f / 254.0f);  // k + 0.5 steps
    x[64 + j] = 0.0f;
    x[96 + j] = j % 3 == 0 ? -2e-38f : 1e-38f;
    x[128 + j] *= 1e7f;
  }
  x[64 + 31] = 4.0f;  // block 2 then holds zeros and one value: |q| 127 there, 0 elsewhere
  x[160 + 5] = std::numeric_limits<float>::infinity();
  x[192 + 7] = std::numeric_limits<float>::quiet_NaN();
  const uint32_t payload_nan = 0x7fc12345;
  std::memcpy(&x[224 + 9], &payload_nan, 4);
  std::memcpy(&x[224 + 20], &payload_nan, 4);  // in each half of the block
  x[256 + 0] = -std::numeric_limits<float>::infinity();
  x[256 + 1] = std::numeric_limits<float>::quiet_NaN();
  x[256 + 30] = std::numeric_limits<float>::quiet_NaN();
  // Block 9: amax 1, so the inverse scale is inexact, and values whose product with it rounds
  // (in float) to k + 0.5 though the exact product is not: a fused multiply-add would round
  // them the other way.
  x.resize(32 * kBlocks);
  x[32 * (kBlocks - 1)] = 1.0f;
  const float inverse = internal::q8_scale_for(1.0f).inverse;
  int near_ties = 0;
  // What ggml's quantiser writes for them: the float product k + 0.5 rounded half to even.
  std::vector<int8_t> near_tie_quants;
  for (int k = 0; k < 120 && near_ties < 31; ++k) {
    const float target = (static_cast<float>(k) + 0.5f) / inverse;
    float v = target;
    for (int step = 0; step < 16; ++step, v = std::nextafter(v, 2.0f)) {
      const double exact = static_cast<double>(v) * static_cast<double>(inverse);
      if (v < 1.0f && v * inverse == static_cast<float>(k) + 0.5f &&
          exact != static_cast<double>(k) + 0.5) {
        x[32 * (kBlocks - 1) + 1 + near_ties++] = v;
        near_tie_quants.push_back(static_cast<int8_t>(k % 2 == 0 ? k : k + 1));
        break;
      }
    }
  }
  ASSERT_GE(near_ties, 8) << "no values whose product rounds to a tie";
  const auto quantise = [&](std::vector<int8_t>* q, std::vector<float>* scale,
                            std::vector<int32_t>* sum) {
    q->assign(32 * kBlocks, 0);
    scale->assign(kBlocks, 0);
    sum->assign(kBlocks, 0);
    internal::quantize_row_q8(x.data(), 32 * kBlocks, q->data(), scale->data(), sum->data());
  };
  std::vector<int8_t> want_q;
  std::vector<float> want_scale;
  std::vector<int32_t> want_sum;
  {
    ScopedIsa scoped(Isa::kPortable);
    quantise(&want_q, &want_scale, &want_sum);
  }
  EXPECT_EQ(want_q[64 + 31], 127);
  // The reference itself, not only its agreement with the vector forms: were its multiply and
  // add contracted into an FMA (matmul.cc built with -mfma), these would round the other way.
  for (int i = 0; i < near_ties; ++i) {
    EXPECT_EQ(want_q[32 * (kBlocks - 1) + 1 + i], near_tie_quants[static_cast<size_t>(i)])
        << "near tie " << i;
  }
  EXPECT_EQ(want_scale[3], 0.0f);
  for (Isa isa : available_isas()) {
    ScopedIsa scoped(isa);
    std::vector<int8_t> q;
    std::vector<float> scale;
    std::vector<int32_t> sum;
    quantise(&q, &scale, &sum);
    for (int b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(std::memcmp(&scale[b], &want_scale[b], 4), 0) << isa_name(isa) << " block " << b;
      EXPECT_EQ(sum[b], want_sum[b]) << isa_name(isa) << " block " << b;
      EXPECT_EQ(std::memcmp(&q[32 * b], &want_q[32 * b], 32), 0) << isa_name(isa) << " block " << b;
    }
  }
}

// The activations a row dot really multiplies with, dequantised.
std::vector<float> effective_acts(DType t, const std::vector<float>& x, QuantizedActs* acts,
                                  std::vector<BlockQ8K>* q8k, std::vector<int8_t>* q,
                                  std::vector<float>* scale, std::vector<int32_t>* sum) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> out(n);
  if (dots_with_q8_k(t)) {
    q8k->resize(n / 256);
    quantize_row_q8_k(x.data(), n, q8k->data());
    acts->q8_k = q8k->data();
    for (int64_t i = 0; i < n; ++i)
      out[i] = (*q8k)[i / 256].d * (*q8k)[i / 256].qs[i % 256];
  } else {
    q->resize(n);
    scale->resize(n / 32);
    sum->resize(n / 32);
    internal::quantize_row_q8(x.data(), n, q->data(), scale->data(), sum->data());
    acts->q8_0 = q->data();
    acts->q8_0_scale = scale->data();
    acts->q8_0_sum = sum->data();
    for (int64_t i = 0; i < n; ++i)
      out[i] = (*q)[i] * (*scale)[i / 32];
  }
  return out;
}

TEST(QuantsTest, RowDotsEqualDequantizedReferenceOnEveryIsa) {
  // 416 = 13 legacy blocks (not a whole number of K-quant blocks: legacy types only).
  for (int64_t n : {256, 256 * 7, 416}) {
    for (DType t : kTypes) {
      if (n % dtype_block_size(t) != 0)
        continue;
      const std::vector<float> w = random_floats(n, 21);
      const std::vector<uint8_t> wq = quantize(t, w);
      const std::vector<float> wd = dequantize(t, wq, n);
      const std::vector<float> x = random_floats(n, 22, -2, 2);
      QuantizedActs acts;
      std::vector<BlockQ8K> q8k;
      std::vector<int8_t> q;
      std::vector<float> scale;
      std::vector<int32_t> sum;
      const std::vector<float> xe = effective_acts(t, x, &acts, &q8k, &q, &scale, &sum);
      double ref = 0;
      double mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(wd[i]) * xe[i];
        mag += std::fabs(static_cast<double>(wd[i]) * xe[i]);
      }
      for (Isa isa : available_isas()) {
        ScopedIsa scoped(isa);
        const float got = quant_row_dot(t, n, wq.data(), acts);
        EXPECT_NEAR(got, ref, 2e-6 * mag + 1e-6)
            << dtype_name(t) << " n=" << n << " on " << isa_name(isa);
      }
    }
  }
}

TEST(QuantsTest, MatmulOnGgmlRowsMatchesReference) {
  ThreadPool pool(2);
  const int64_t rows = 37;
  // 224 columns: a legacy row whose last 64-column run of the GEMM's panel is half full; 416: 13
  // legacy blocks (an odd count for the x16 layout's groups). 37 rows: the last panel has 5.
  for (int64_t cols : {512, 224, 416}) {
    for (DType t : kTypes) {
      if (t == DType::kQ8_0 || cols % dtype_block_size(t) != 0)
        continue;  // Q8_0 has its own panel format (matmul_test.cc)
      const WeightFormat format = *native_weight_format(t);
      const std::vector<float> wf = random_floats(rows * cols, 31);
      std::vector<uint8_t> wq(dtype_num_bytes(t, rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        quantize_row(t, &wf[r * cols], cols, wq.data() + r * dtype_num_bytes(t, cols));
      }
      // Packed under the portable table (the file's row layout) and under the CPU's best (the
      // legacy types and the K-quants x16-interleaved where it has VNNI); every ISA then
      // computes on both.
      Result<PackedWeight> file_layout = [&] {
        ScopedIsa scoped(Isa::kPortable);
        return pack_weight(wq.data(), t, rows, cols, format);
      }();
      // Same-type sources keep their bytes; float sources are quantised the same way.
      Result<PackedWeight> from_bytes = pack_weight(wq.data(), t, rows, cols, format);
      Result<PackedWeight> from_float = pack_weight(wf.data(), DType::kF32, rows, cols, format);
      ASSERT_TRUE(from_bytes.is_ok() && from_float.is_ok() && file_layout.is_ok()) << dtype_name(t);
      EXPECT_FALSE(file_layout->is_x16());
      EXPECT_EQ(from_bytes->is_x16(), internal::x16_gemv(internal::active_table(), t) != nullptr)
          << dtype_name(t);
      const std::vector<float> wd = unpack_weight(*from_bytes);
      EXPECT_EQ(wd, unpack_weight(*from_float)) << dtype_name(t);
      EXPECT_EQ(wd, unpack_weight(*file_layout)) << dtype_name(t);
      EXPECT_EQ(wd, dequantize(t, wq, rows * cols)) << dtype_name(t);
      for (int64_t p = 0; p < from_bytes->num_panels(); ++p) {
        // The weights fingerprint reads these: the same on every CPU.
        ASSERT_EQ(panel_file_rows(*from_bytes, p), panel_file_rows(*file_layout, p))
            << dtype_name(t) << " panel " << p;
      }
      const std::vector<float> bias = random_floats(rows, 33);
      // 1-4 tokens take the row dots or the x16 GEMV (every token-count kernel); 5 and 8 the
      // GEMM on row panels but two passes of the x16 GEMV (kX16GemmMinTokens); 9 and up the
      // GEMM where the CPU has VNNI: the legacy types' 6-token tiles plus tails of 3, 4, 5, 2
      // and 1, the K-quants' 4-token tiles plus 1, 2, 3, 2 and 1.
      for (int64_t num_tokens : {1, 2, 3, 4, 5, 8, 9, 10, 11, 14, 37}) {
        for (const PackedWeight* packed : {&*from_bytes, &*file_layout}) {
          const std::vector<float> x = random_floats(num_tokens * cols, 34);
          std::vector<float> y(num_tokens * rows);
          for (Isa isa : available_isas()) {
            ScopedIsa scoped(isa);
            // Refilled per ISA, so a kernel that skips outputs cannot inherit the last ISA's.
            std::fill(y.begin(), y.end(), -7.0f);
            matmul(x.data(), num_tokens, *packed, bias.data(), y.data(), pool);
            for (int64_t tk = 0; tk < num_tokens; ++tk) {
              QuantizedActs acts;
              std::vector<BlockQ8K> q8k;
              std::vector<int8_t> q;
              std::vector<float> scale;
              std::vector<int32_t> sum;
              const std::vector<float> xt(x.begin() + tk * cols, x.begin() + (tk + 1) * cols);
              const std::vector<float> xe = effective_acts(t, xt, &acts, &q8k, &q, &scale, &sum);
              for (int64_t r = 0; r < rows; ++r) {
                double ref = bias[r];
                double mag = std::fabs(ref);
                double loose = bias[r];
                for (int64_t c = 0; c < cols; ++c) {
                  ref += static_cast<double>(wd[r * cols + c]) * xe[c];
                  mag += std::fabs(static_cast<double>(wd[r * cols + c]) * xe[c]);
                  loose += static_cast<double>(wd[r * cols + c]) * xt[c];
                }
                ASSERT_NEAR(y[tk * rows + r], ref, 2e-6 * mag + 1e-6)
                    << dtype_name(t) << " " << isa_name(isa) << " t=" << tk << " r=" << r;
                // Against the unquantised activations: the activation quantisation error only.
                ASSERT_NEAR(y[tk * rows + r], loose, 0.02 * mag + 1e-4) << dtype_name(t);
              }
            }
          }
        }
      }
    }
  }
}

// The ggml GEMM sits in the VNNI table exactly when the CPU has it (matmul's 5+ token calls on
// ggml rows then go through it; the lower tables keep the row dots).
TEST(QuantsTest, GgmlGemmIsInTheVnniTableOnly) {
  EXPECT_EQ(internal::kernel_table(Isa::kAvx512Bf16).gemm_ggml != nullptr,
            detected_isa() >= Isa::kAvx512Bf16);
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512})
    EXPECT_EQ(internal::kernel_table(isa).gemm_ggml, nullptr) << isa_name(isa);
}

TEST(QuantsTest, PackRejectsPartialBlocks) {
  const std::vector<float> w = random_floats(4 * 96, 1);
  EXPECT_FALSE(pack_weight(w.data(), DType::kF32, 4, 96, WeightFormat::kQ4_K).is_ok());
  EXPECT_TRUE(pack_weight(w.data(), DType::kF32, 4, 96, WeightFormat::kQ5_0).is_ok());
}

}  // namespace
}  // namespace crescent::kernels
