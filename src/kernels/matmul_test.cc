#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/kernel_table.h"
#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::ScopedIsa;

// A kernel path: an ISA and, for avx512bf16, which BF16 GEMM (bf16_gemm_uses_dot).
struct Path {
  Isa isa;
  bool bf16_dot;
  [[nodiscard]] std::string name() const {
    return std::string(isa_name(isa)) + (isa == Isa::kAvx512Bf16 && !bf16_dot ? "/fma" : "");
  }
};

// Every ISA this CPU has, avx512bf16 with each BF16 GEMM.
std::vector<Path> available_paths() {
  std::vector<Path> paths;
  for (Isa isa : available_isas()) {
    paths.push_back({isa, true});
    if (isa == Isa::kAvx512Bf16) {
      paths.push_back({isa, false});
    }
  }
  return paths;
}

// Selects a path for a test scope and restores the previous one.
class ScopedPath {
 public:
  explicit ScopedPath(const Path& path) : isa_(path.isa), saved_dot_(bf16_gemm_uses_dot()) {
    set_bf16_gemm_uses_dot(path.bf16_dot);
  }
  ~ScopedPath() { set_bf16_gemm_uses_dot(saved_dot_); }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;

 private:
  ScopedIsa isa_;
  bool saved_dot_;
};

// The activations the active path actually multiplies with: x itself for f32 math, x rounded
// to BF16 for the vdpbf16ps GEMM, x quantised to Q8_0 for Q8_0 weights.
std::vector<float> effective_x(const std::vector<float>& x, int64_t num_tokens, int64_t cols,
                               WeightFormat format, const Path& path) {
  std::vector<float> out = x;
  if (format == WeightFormat::kBF16 && path.isa == Isa::kAvx512Bf16 && path.bf16_dot &&
      num_tokens >= kGemmMinTokens) {
    for (float& v : out)
      v = bf16_to_float(float_to_bf16(v));
  } else if (format == WeightFormat::kQ8_0) {
    const int64_t kp = (cols + 31) / 32 * 32;
    std::vector<float> row(kp);
    std::vector<int8_t> q(kp);
    std::vector<float> scales(kp / 32);
    std::vector<int32_t> sums(kp / 32);
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::fill(row.begin(), row.end(), 0.0f);
      std::memcpy(row.data(), &x[t * cols], cols * sizeof(float));
      internal::quantize_row_q8(row.data(), kp, q.data(), scales.data(), sums.data());
      for (int64_t c = 0; c < cols; ++c)
        out[t * cols + c] = q[c] * scales[c / 32];
    }
  }
  return out;
}

// Checks y against a double-precision naive product of the unpacked weight and xe, within
// rel * sum|w x| per element.
void expect_matches_naive(const std::vector<float>& y, const std::vector<float>& w,
                          const std::vector<float>& xe, const std::vector<float>& bias,
                          int64_t num_tokens, int64_t rows, int64_t cols, double rel,
                          const std::string& what) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = bias.empty() ? 0.0 : bias[r];
      double mag = std::fabs(ref);
      for (int64_t c = 0; c < cols; ++c) {
        ref += static_cast<double>(w[r * cols + c]) * xe[t * cols + c];
        mag += std::fabs(static_cast<double>(w[r * cols + c]) * xe[t * cols + c]);
      }
      ASSERT_NEAR(y[t * rows + r], ref, rel * mag + 1e-6) << what << " t=" << t << " r=" << r;
    }
  }
}

struct Shape {
  int64_t rows;
  int64_t cols;
};

TEST(MatmulTest, EveryIsaMatchesNaiveReferenceOnOddShapes) {
  const Shape shapes[] = {{1, 1}, {17, 7}, {33, 45}, {16, 64}, {50, 130}, {31, 96}};
  const int64_t token_counts[] = {1, 2, 3, 4, 5, 12, 13, 37};
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8_0}) {
    for (const Shape& s : shapes) {
      const auto w_src = random_floats(s.rows * s.cols, seed++);
      auto packed = pack_weight(w_src.data(), DType::kF32, s.rows, s.cols, format);
      ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
      const std::vector<float> w = unpack_weight(*packed);
      const auto bias = random_floats(s.rows, seed++);
      for (int64_t nt : token_counts) {
        const auto x = random_floats(nt * s.cols, seed++);
        for (const Path& path : available_paths()) {
          ScopedPath scoped(path);
          std::vector<float> y(nt * s.rows, -7.0f);
          const bool with_bias = nt % 2 == 1;
          matmul(x.data(), nt, *packed, with_bias ? bias.data() : nullptr, y.data(), pool);
          const std::string what = std::string(weight_format_name(format)) + " " + path.name() +
                                   " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                   " tokens=" + std::to_string(nt);
          // Exact inputs of the path: only f32 rounding of the sums is left.
          const auto xe = effective_x(x, nt, s.cols, format, path);
          expect_matches_naive(y, w, xe, with_bias ? bias : std::vector<float>{}, nt, s.rows,
                               s.cols, 2e-6 * std::sqrt(static_cast<double>(s.cols)) + 1e-6, what);
          // Against the true activations: BF16 rounding is 2^-9 relative per product; Q8_0
          // activation rounding is at most max|x| / 254 per element (|x| <= 1 here).
          double rel = 1e-5;
          if (format == WeightFormat::kQ8_0)
            rel = 0.05;
          if (xe != x && format == WeightFormat::kBF16)
            rel = 1.0 / 256;
          expect_matches_naive(y, w, x, with_bias ? bias : std::vector<float>{}, nt, s.rows, s.cols,
                               rel, what + " (true x)");
        }
      }
    }
  }
}

TEST(MatmulTest, LargeShapesAgreeAcrossIsasAndThreadCounts) {
  // Shapes that exercise K blocking (cols > 2048) and many panels per thread.
  const Shape shapes[] = {{130, 2500}, {96, 896}};
  ThreadPool one(1);
  ThreadPool two(2);
  uint32_t seed = 100;
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8_0}) {
    for (const Shape& s : shapes) {
      const auto w_src = random_floats(s.rows * s.cols, seed++);
      auto packed = pack_weight(w_src.data(), DType::kF32, s.rows, s.cols, format);
      ASSERT_TRUE(packed.is_ok());
      const std::vector<float> w = unpack_weight(*packed);
      static_assert(internal::kQ8GemmMinTokens <= 37);  // so that Q8_0's GEMM runs here
      for (int64_t nt : {1, 29, 37}) {
        const auto x = random_floats(nt * s.cols, seed++);
        for (const Path& path : available_paths()) {
          ScopedPath scoped(path);
          std::vector<float> y1(nt * s.rows), y2(nt * s.rows);
          matmul(x.data(), nt, *packed, nullptr, y1.data(), one);
          matmul(x.data(), nt, *packed, nullptr, y2.data(), two);
          ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)))
              << "thread count changed the result: " << path.name();
          const auto xe = effective_x(x, nt, s.cols, format, path);
          expect_matches_naive(y2, w, xe, {}, nt, s.rows, s.cols, 2e-5,
                               std::string(weight_format_name(format)) + " " + path.name());
        }
      }
    }
  }
}

// A Q8_0 file may hold q = -128 (ggml's quantiser never writes it, other writers may): every
// ISA's block dot must stay exact, e.g. AVX2's vpmaddubsw must not saturate or negate it.
TEST(MatmulTest, Q8WeightsOfMinus128StayExactOnEveryIsa) {
  const int64_t rows = 24;
  const int64_t cols = 96;
  std::vector<Q8Block> blocks(rows * cols / 32);
  std::mt19937 rng(9);
  for (Q8Block& b : blocks) {
    b.scale_f16 = float_to_f16(0.01f);
    for (int8_t& q : b.quants)
      q = rng() % 2 == 0 ? int8_t{-128} : static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  }
  auto packed = pack_weight(blocks.data(), DType::kQ8_0, rows, cols, WeightFormat::kQ8_0);
  ASSERT_TRUE(packed.is_ok());
  const std::vector<float> w = unpack_weight(*packed);
  ThreadPool pool(2);
  for (int64_t nt : {1, 3, 6}) {
    const auto x = random_floats(nt * cols, 10);
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> y(nt * rows, -7.0f);
      matmul(x.data(), nt, *packed, nullptr, y.data(), pool);
      const auto xe = effective_x(x, nt, cols, WeightFormat::kQ8_0, {isa, true});
      expect_matches_naive(y, w, xe, {}, nt, rows, cols, 1e-5,
                           std::string(isa_name(isa)) + " tokens=" + std::to_string(nt));
    }
  }
}

TEST(PackWeightTest, RoundTripsExactFormats) {
  const int64_t rows = 19;
  const int64_t cols = 37;
  const auto w = random_floats(rows * cols, 7);
  auto f32 = pack_weight(w.data(), DType::kF32, rows, cols, WeightFormat::kF32);
  ASSERT_TRUE(f32.is_ok());
  EXPECT_EQ(unpack_weight(*f32), w);
  EXPECT_EQ(f32->rows(), rows);
  EXPECT_EQ(f32->cols(), cols);
  EXPECT_EQ(f32->num_bytes() % 64, 0);

  std::vector<uint16_t> bf16(w.size());
  std::vector<uint16_t> f16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bf16[i] = float_to_bf16(w[i]);
    f16[i] = float_to_f16(w[i]);
  }
  auto from_bf16 = pack_weight(bf16.data(), DType::kBF16, rows, cols, WeightFormat::kBF16);
  auto from_f32 = pack_weight(w.data(), DType::kF32, rows, cols, WeightFormat::kBF16);
  auto f16_to_f32 = pack_weight(f16.data(), DType::kF16, rows, cols, WeightFormat::kF32);
  ASSERT_TRUE(from_bf16.is_ok() && from_f32.is_ok() && f16_to_f32.is_ok());
  const auto a = unpack_weight(*from_bf16);
  const auto b = unpack_weight(*from_f32);
  const auto c = unpack_weight(*f16_to_f32);
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(a[i], bf16_to_float(bf16[i]));
    ASSERT_EQ(b[i], bf16_to_float(bf16[i]));
    ASSERT_EQ(c[i], f16_to_float(f16[i]));
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(from_bf16->panel(0)) % 64, 0u);
}

TEST(PackWeightTest, Q8SourceKeepsItsExactBits) {
  const int64_t rows = 5;
  const int64_t cols = 64;
  std::vector<Q8Block> blocks(rows * cols / 32);
  std::mt19937 rng(3);
  for (Q8Block& b : blocks) {
    b.scale_f16 = float_to_f16(std::uniform_real_distribution<float>(0.001f, 0.1f)(rng));
    for (int8_t& q : b.quants)
      q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  }
  auto q8 = pack_weight(blocks.data(), DType::kQ8_0, rows, cols, WeightFormat::kQ8_0);
  auto f32 = pack_weight(blocks.data(), DType::kQ8_0, rows, cols, WeightFormat::kF32);
  ASSERT_TRUE(q8.is_ok() && f32.is_ok());
  const auto a = unpack_weight(*q8);
  const auto b = unpack_weight(*f32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const Q8Block& blk = blocks[r * 2 + c / 32];
      const float expected = f16_to_float(blk.scale_f16) * blk.quants[c % 32];
      ASSERT_EQ(a[r * cols + c], expected);
      ASSERT_EQ(b[r * cols + c], expected);
    }
  }
}

// The Q8_0 panel layout (kernel_table.h): block pairs of [scales 2 x 32 B][quants 2 x 512 B], a
// final odd block as [its scales + 32 B pad][quants], every quant run 64-byte aligned.
TEST(PackWeightTest, Q8PanelStoresBlockPairsScalesFirst) {
  EXPECT_EQ(internal::q8_scales_offset(0), 0);
  EXPECT_EQ(internal::q8_scales_offset(1), 32);
  EXPECT_EQ(internal::q8_quants_offset(0), 64);
  EXPECT_EQ(internal::q8_quants_offset(1), 576);
  EXPECT_EQ(internal::q8_scales_offset(2), 1088);
  EXPECT_EQ(internal::q8_quants_offset(2), 1152);
  EXPECT_EQ(internal::q8_panel_bytes(96), 1664);
  EXPECT_EQ(internal::q8_panel_bytes(128), 2176);

  const int64_t rows = 20;  // a full panel and a partial one
  const int64_t cols = 96;
  std::vector<Q8Block> blocks(rows * cols / 32);
  std::mt19937 rng(5);
  for (Q8Block& b : blocks) {
    b.scale_f16 = static_cast<uint16_t>(rng());
    for (int8_t& q : b.quants)
      q = static_cast<int8_t>(rng());
  }
  auto q8 = pack_weight(blocks.data(), DType::kQ8_0, rows, cols, WeightFormat::kQ8_0);
  ASSERT_TRUE(q8.is_ok());
  EXPECT_EQ(q8->panel_stride_bytes(), 1664);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* panel = reinterpret_cast<const uint8_t*>(q8->panel(r / 16));
    const int64_t ri = r % 16;
    for (int64_t b = 0; b < 3; ++b) {
      const Q8Block& blk = blocks[r * 3 + b];
      uint16_t scale = 0;
      std::memcpy(&scale, panel + internal::q8_scales_offset(b) + 2 * ri, 2);
      ASSERT_EQ(scale, blk.scale_f16) << r << " " << b;
      for (int c = 0; c < 32; ++c) {
        const uint8_t u = panel[internal::q8_quants_offset(b) + (c / 4) * 64 + ri * 4 + c % 4];
        ASSERT_EQ(static_cast<int8_t>(u ^ 0x80), blk.quants[c]) << r << " " << b << " " << c;
      }
    }
  }
}

TEST(PackWeightTest, Q8QuantisationErrorIsWithinHalfAStep) {
  const int64_t rows = 9;
  const int64_t cols = 70;  // padded to 96 inside
  auto w = random_floats(rows * cols, 11, -3, 3);
  w[5] = 0;  // an all-small block must not divide by zero
  auto q8 = pack_weight(w.data(), DType::kF32, rows, cols, WeightFormat::kQ8_0);
  ASSERT_TRUE(q8.is_ok());
  EXPECT_EQ(q8->padded_cols(), 96);
  const auto u = unpack_weight(*q8);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b * 32 < cols; ++b) {
      float amax = 0;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
        amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float step = amax / 127;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
        // Half a step from rounding, plus the F16 rounding of the scale (2^-11 relative).
        ASSERT_LE(std::fabs(u[r * cols + c] - w[r * cols + c]), step * 0.5f + amax * 1e-3f)
            << r << "," << c;
      }
    }
  }
  // ggml's rule on a known block: x = 0..31 gives d = 31/127 and q = round(x * 127 / 31).
  std::vector<float> ramp(32);
  for (int i = 0; i < 32; ++i)
    ramp[i] = static_cast<float>(i);
  auto qr = pack_weight(ramp.data(), DType::kF32, 1, 32, WeightFormat::kQ8_0);
  ASSERT_TRUE(qr.is_ok());
  const auto ur = unpack_weight(*qr);
  const float d = f16_to_float(float_to_f16(31.0f / 127));
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(ur[i], d * std::lround(i * (127.0f / 31.0f))) << i;
  }
}

TEST(PackWeightTest, RejectsBadShapes) {
  std::vector<float> w(64);
  EXPECT_EQ(pack_weight(w.data(), DType::kF32, 0, 4, WeightFormat::kF32).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pack_weight(nullptr, DType::kF32, 2, 4, WeightFormat::kF32).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pack_weight(w.data(), DType::kQ8_0, 1, 40, WeightFormat::kQ8_0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(IsaTest, NamesParseAndUnsupportedIsRefused) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    auto parsed = parse_isa(isa_name(isa));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, isa);
    EXPECT_EQ(set_active_isa(isa).is_ok(), isa <= detected_isa());
  }
  EXPECT_FALSE(parse_isa("sse9").is_ok());
  ASSERT_TRUE(set_active_isa(detected_isa()).is_ok());
  EXPECT_EQ(active_isa(), detected_isa());
}

}  // namespace
}  // namespace crescent::kernels
