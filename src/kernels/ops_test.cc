#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::ScopedIsa;

TEST(RmsNormTest, EveryIsaMatchesDoubleReference) {
  for (int64_t dim : {1, 7, 16, 33, 899}) {
    const int64_t rows = 3;
    const auto x = random_floats(rows * dim, static_cast<uint32_t>(dim), -4, 4);
    const auto w = random_floats(dim, static_cast<uint32_t>(dim) + 1, 0.5f, 1.5f);
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> y(rows * dim);
      rms_norm(x.data(), w.data(), rows, dim, 1e-6f, y.data());
      std::vector<float> in_place = x;
      rms_norm(in_place.data(), w.data(), rows, dim, 1e-6f, in_place.data());
      EXPECT_EQ(in_place, y) << "aliasing changed the result";
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i)
          ss += double{x[r * dim + i]} * x[r * dim + i];
        const double inv = 1 / std::sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; ++i) {
          const double ref = x[r * dim + i] * inv * w[i];
          ASSERT_NEAR(y[r * dim + i], ref, 2e-6 * (1 + std::fabs(ref)))
              << isa_name(isa) << " dim=" << dim;
        }
      }
    }
  }
}

TEST(ElementwiseTest, AddAndSiluMulMatchReferenceOnEveryIsa) {
  for (int64_t n : {1, 5, 8, 17, 100, 4867}) {
    auto gate = random_floats(n, static_cast<uint32_t>(n), -12, 12);
    if (n > 4) {
      gate[0] = -100;  // exp overflow region
      gate[1] = 100;
      gate[2] = 0;
      gate[3] = -87.5f;
    }
    const auto up = random_floats(n, static_cast<uint32_t>(n) + 1, -2, 2);
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> out(n);
      silu_mul(gate.data(), up.data(), n, out.data());
      std::vector<float> sum = up;
      add_inplace(sum.data(), gate.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i];
        const double ref = g / (1 + std::exp(-g)) * up[i];
        ASSERT_NEAR(out[i], ref, 1e-6 * (1 + std::fabs(ref))) << isa_name(isa) << " g=" << g;
        ASSERT_EQ(sum[i], up[i] + gate[i]);
      }
    }
  }
}

// HF apply_rotary_pos_emb with rotate_half, in double.
void naive_rope(std::vector<double>& x, int64_t pos, int head_dim, const std::vector<double>& f) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double c = std::cos(pos * f[i]);
    const double s = std::sin(pos * f[i]);
    const double a = x[i];
    const double b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

TEST(RopeTest, MatchesHfRotateHalf) {
  const int head_dim = 64;
  const int num_heads = 3;
  RopeTable table(head_dim, 1e6, 4096, RopeScaling{});
  ASSERT_EQ(table.inv_freq().size(), 32u);
  EXPECT_DOUBLE_EQ(table.inv_freq()[0], 1.0);
  EXPECT_DOUBLE_EQ(table.inv_freq()[16], std::pow(1e6, -0.5));
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 3};
  const int64_t nt = static_cast<int64_t>(positions.size());
  auto x = random_floats(nt * num_heads * head_dim, 5);
  const auto original = x;
  rope(x.data(), positions.data(), nt, num_heads, table);
  for (int64_t t = 0; t < nt; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const int64_t off = (t * num_heads + h) * head_dim;
      std::vector<double> ref(original.begin() + off, original.begin() + off + head_dim);
      naive_rope(ref, positions[t], head_dim, table.inv_freq());
      for (int i = 0; i < head_dim; ++i) {
        ASSERT_NEAR(x[off + i], ref[i], 2e-6) << "t=" << t << " i=" << i;
        if (positions[t] == 0) {
          ASSERT_EQ(x[off + i], original[off + i]);
        }
      }
    }
  }
}

// HF's apply_multimodal_rotary_pos_emb: pair i turns with the position of the mrope section it
// falls in.
TEST(RopeTest, MultimodalSectionsPickTheirPosition) {
  const int head_dim = 16;
  const int num_heads = 2;
  const std::vector<int> sections = {2, 3, 3};
  RopeTable table(head_dim, 1e6, 256, RopeScaling{});
  const std::vector<int32_t> positions3 = {5, 5, 5, 3, 7, 11, 0, 200, 1};
  const int64_t nt = 3;
  auto x = random_floats(nt * num_heads * head_dim, 9);
  const auto original = x;
  rope_multi(x.data(), positions3.data(), nt, num_heads, table, sections);
  for (int64_t t = 0; t < nt; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const int64_t off = (t * num_heads + h) * head_dim;
      for (int i = 0; i < head_dim / 2; ++i) {
        const int section = i < 2 ? 0 : i < 5 ? 1 : 2;
        const double angle = positions3[t * 3 + section] * table.inv_freq()[i];
        const double a = original[off + i];
        const double b = original[off + i + head_dim / 2];
        ASSERT_NEAR(x[off + i], a * std::cos(angle) - b * std::sin(angle), 2e-6);
        ASSERT_NEAR(x[off + i + head_dim / 2], b * std::cos(angle) + a * std::sin(angle), 2e-6);
      }
    }
  }
  // Equal positions: exactly rope().
  auto y = original;
  const std::vector<int32_t> one_d = {5};
  rope(y.data(), one_d.data(), 1, num_heads, table);
  for (int i = 0; i < num_heads * head_dim; ++i) {
    ASSERT_EQ(x[i], y[i]);
  }
}

TEST(RopeTest, Llama3FrequencyScaling) {
  RopeScaling s;
  s.is_llama3 = true;
  s.factor = 32;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  const int head_dim = 64;
  RopeTable scaled(head_dim, 500000, 8, s);
  RopeTable plain(head_dim, 500000, 8, RopeScaling{});
  int num_high = 0;
  int num_low = 0;
  int num_medium = 0;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double f = plain.inv_freq()[i];
    const double wavelen = 2 * std::numbers::pi / f;
    double expected = f;
    if (wavelen < 8192.0 / 4) {
      ++num_high;
    } else if (wavelen > 8192.0 / 1) {
      expected = f / 32;
      ++num_low;
    } else {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      expected = (1 - smooth) * f / 32 + smooth * f;
      ++num_medium;
    }
    EXPECT_NEAR(scaled.inv_freq()[i], expected, 1e-12 * f) << i;
  }
  EXPECT_GT(num_high, 0);
  EXPECT_GT(num_low, 0);
  EXPECT_GT(num_medium, 0);
}

TEST(SoftmaxScaledTest, EveryIsaMatchesDoubleReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 30.0f);
  for (int64_t n : {1, 5, 16, 17, 100, 4784}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x)
      v = d(rng);
    const float scale = 0.11f;
    double max_scaled = -1e300;
    for (float v : x)
      max_scaled = std::max(max_scaled, static_cast<double>(v) * scale);
    std::vector<double> want(x.size());
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i)
      sum += want[i] = std::exp(static_cast<double>(x[i]) * scale - max_scaled);
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> got = x;
      softmax_scaled(got.data(), n, scale);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(got[i], want[i] / sum, 1e-5 * want[i] / sum + 1e-12)
            << isa_name(isa) << " n " << n << " i " << i;
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> masked = {-inf, 0, -inf};
  softmax_scaled(masked.data(), 3, 0.5f);
  EXPECT_EQ(masked[0], 0);
  EXPECT_EQ(masked[1], 1);
}

TEST(MaxValueTest, EveryIsaIgnoresNanAndHandlesTails) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 5, 15, 16, 17, 100, 151936}) {
    auto x = random_floats(n, static_cast<uint32_t>(n), -50, 50);
    const int64_t at = n / 2;
    x[at] = 77.0f;  // the maximum, in the middle (in the tail lanes for small n)
    if (n > 3) {
      x[0] = nan;
      x[n - 1] = nan;
    }
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      EXPECT_EQ(max_value(x.data(), n), 77.0f) << isa_name(isa) << " n " << n;
    }
  }
  const std::vector<float> all_nan(20, nan);
  const std::vector<float> all_minus_inf(20, -inf);
  const std::vector<float> with_inf = {1, inf, 3};
  for (Isa isa : available_isas()) {
    ScopedIsa scoped(isa);
    EXPECT_EQ(max_value(all_nan.data(), 20), -inf) << isa_name(isa);
    EXPECT_EQ(max_value(all_minus_inf.data(), 20), -inf) << isa_name(isa);
    EXPECT_EQ(max_value(with_inf.data(), 3), inf) << isa_name(isa);
    EXPECT_EQ(max_value(with_inf.data(), 0), -inf) << isa_name(isa);
  }
}

TEST(ExpScaledTest, EveryIsaMatchesDoubleReferenceAndZeroesMinusInf) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 16, 17, 1000}) {
    auto x = random_floats(n, static_cast<uint32_t>(n) + 3, -30, 0);
    x[0] = -inf;
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> got = x;
      const float sum = exp_scaled(got.data(), n, 0.5f, 1.0f);
      double want_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(static_cast<double>(x[i]) * 0.5 - 1.0);
        want_sum += want;
        ASSERT_NEAR(got[i], want, 1e-6 * want + 1e-30) << isa_name(isa) << " i " << i;
      }
      EXPECT_EQ(got[0], 0.0f) << isa_name(isa);
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << isa_name(isa);
    }
  }
}

TEST(SamplingTest, ArgmaxSoftmaxLogSumExp) {
  const float x[] = {1, 5, -3, 5, 2};
  EXPECT_EQ(argmax(x, 5), 1);  // first of a tie
  std::vector<float> big = {1000, 1001, 999};
  const float lse = log_sum_exp(big.data(), 3);
  EXPECT_NEAR(lse, 1001 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-3);
  softmax(big.data(), 3);
  double total = 0;
  for (float p : big) {
    EXPECT_TRUE(std::isfinite(p));
    total += p;
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_NEAR(big[1], 1 / (1 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> masked = {-inf, 0, -inf};
  softmax(masked.data(), 3);
  EXPECT_EQ(masked[0], 0);
  EXPECT_EQ(masked[1], 1);
  const float all_masked[] = {-inf, -inf};
  EXPECT_EQ(log_sum_exp(all_masked, 2), -inf);
}

}  // namespace
}  // namespace crescent::kernels
