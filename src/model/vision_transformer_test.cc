#include "model/vision_transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crescent::model {
namespace {

// An in-memory TensorSource of F32 tensors.
class FakeTensorSource : public TensorSource {
 public:
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };

  Result<TensorView> get(const std::string& hf_name) const override {
    auto it = tensors_.find(hf_name);
    if (it == tensors_.end())
      return not_found("no tensor " + hf_name);
    TensorView v;
    v.name = hf_name;
    v.dtype = DType::kF32;
    v.shape = it->second.shape;
    v.data = it->second.data.data();
    v.num_bytes = static_cast<int64_t>(it->second.data.size() * sizeof(float));
    return v;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [name, t] : tensors_) {
      n.push_back(name);
    }
    return n;
  }

  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float> data) {
    tensors_[name] = {std::move(shape), std::move(data)};
  }
  void erase(const std::string& name) { tensors_.erase(name); }
  const Tensor& at(const std::string& name) const { return tensors_.at(name); }
  std::map<std::string, Tensor>& tensors() { return tensors_; }

 private:
  std::map<std::string, Tensor> tensors_;
};

// Deterministic values in [-1, 1) (splitmix64).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  double uniform() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 52) - 1.0;
  }
  std::vector<float> values(int64_t n, double scale, double offset = 0) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = static_cast<float>(offset + scale * uniform());
    }
    return v;
  }

 private:
  uint64_t state_;
};

VisionConfig tiny_config(VisionArchitecture arch) {
  VisionConfig c;
  c.architecture = arch;
  c.depth = 2;
  c.embed_dim = 32;
  c.num_heads = 2;
  c.intermediate_size = 64;
  c.out_hidden_size = 48;
  c.patch_size = 14;
  c.temporal_patch_size = 2;
  c.spatial_merge_size = 2;
  c.in_channels = 3;
  if (arch == VisionArchitecture::kQwen25Vl) {
    c.depth = 4;
    c.fullatt_block_indexes = {1, 3};
    c.window_size = 56;  // 2 x 2 merged units per window
  }
  return c;
}

// Weights scaled so that activations stay of order 1 through the blocks.
FakeTensorSource make_weights(const VisionConfig& c, const std::string& prefix, uint64_t seed) {
  FakeTensorSource src;
  Random rng(seed);
  const int64_t e = c.embed_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t merged = int64_t{c.merge_unit()} * e;
  const bool is_qwen2 = c.architecture == VisionArchitecture::kQwen2Vl;
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols, bool bias) {
    src.add(name + ".weight", {rows, cols},
            rng.values(rows * cols, 1.0 / std::sqrt(static_cast<double>(cols))));
    if (bias)
      src.add(name + ".bias", {rows}, rng.values(rows, 0.1));
  };
  auto norm = [&](const std::string& name) {
    src.add(name + ".weight", {e}, rng.values(e, 0.2, 1.0));
    if (is_qwen2)
      src.add(name + ".bias", {e}, rng.values(e, 0.1));
  };
  src.add(prefix + "patch_embed.proj.weight",
          {e, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size},
          rng.values(e * c.patch_dim(), 1.0 / std::sqrt(static_cast<double>(c.patch_dim()))));
  for (int b = 0; b < c.depth; ++b) {
    const std::string block = prefix + "blocks." + std::to_string(b) + ".";
    norm(block + "norm1");
    norm(block + "norm2");
    linear(block + "attn.qkv", 3 * e, e, true);
    linear(block + "attn.proj", e, e, true);
    if (is_qwen2) {
      linear(block + "mlp.fc1", inter, e, true);
      linear(block + "mlp.fc2", e, inter, true);
    } else {
      linear(block + "mlp.gate_proj", inter, e, true);
      linear(block + "mlp.up_proj", inter, e, true);
      linear(block + "mlp.down_proj", e, inter, true);
    }
  }
  norm(prefix + "merger.ln_q");
  linear(prefix + "merger.mlp.0", merged, merged, true);
  linear(prefix + "merger.mlp.2", c.out_hidden_size, merged, true);
  return src;
}

// ---------------------------------------------------------------------------------------------
// A naive float64 implementation from the architecture description (no code shared with
// vision_transformer.cc). It keeps the input order throughout and expresses window attention
// as "attend only to patches of the same frame and window", rather than reordering rows.

using Matrix = std::vector<std::vector<double>>;

Matrix zeros(int64_t rows, int64_t cols) {
  return Matrix(static_cast<size_t>(rows), std::vector<double>(static_cast<size_t>(cols), 0.0));
}

std::vector<double> as_double(const FakeTensorSource& src, const std::string& name) {
  const auto& t = src.at(name);
  return {t.data.begin(), t.data.end()};
}

// y = x W^T + b, W [out][in] row-major.
Matrix linear(const Matrix& x, const FakeTensorSource& src, const std::string& name,
              bool has_bias) {
  const std::vector<double> w = as_double(src, name + ".weight");
  const auto& shape = src.at(name + ".weight").shape;
  const int64_t out = shape[0];
  const int64_t in = static_cast<int64_t>(w.size()) / out;
  std::vector<double> b(static_cast<size_t>(out), 0.0);
  if (has_bias)
    b = as_double(src, name + ".bias");
  Matrix y = zeros(static_cast<int64_t>(x.size()), out);
  for (size_t i = 0; i < x.size(); ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b[static_cast<size_t>(o)];
      for (int64_t k = 0; k < in; ++k) {
        s += x[i][static_cast<size_t>(k)] * w[static_cast<size_t>(o * in + k)];
      }
      y[i][static_cast<size_t>(o)] = s;
    }
  }
  return y;
}

Matrix normalize(const Matrix& x, const FakeTensorSource& src, const std::string& name,
                 bool layer_norm) {
  const std::vector<double> w = as_double(src, name + ".weight");
  Matrix y = x;
  for (size_t i = 0; i < x.size(); ++i) {
    const auto n = static_cast<double>(x[i].size());
    double mean = 0;
    if (layer_norm) {
      for (double v : x[i]) {
        mean += v / n;
      }
    }
    double var = 0;
    for (double v : x[i]) {
      var += (v - mean) * (v - mean) / n;
    }
    for (size_t k = 0; k < x[i].size(); ++k) {
      y[i][k] = (x[i][k] - mean) / std::sqrt(var + 1e-6) * w[k];
    }
    if (layer_norm) {
      const std::vector<double> b = as_double(src, name + ".bias");
      for (size_t k = 0; k < x[i].size(); ++k) {
        y[i][k] += b[k];
      }
    }
  }
  return y;
}

std::vector<double> reference_encode(const VisionConfig& c, const FakeTensorSource& src,
                                     const std::vector<float>& pixels, int grid_t, int grid_h,
                                     int grid_w) {
  const std::string p = "visual.";
  const bool qwen2 = c.architecture == VisionArchitecture::kQwen2Vl;
  const int m = c.spatial_merge_size;
  const int unit = m * m;
  const int64_t n = int64_t{grid_t} * grid_h * grid_w;
  const int e = c.embed_dim;
  const int heads = c.num_heads;
  const int d = e / heads;
  const int patch_dim = c.patch_dim();
  const int window_units = qwen2 ? 0 : c.window_size / m / c.patch_size;

  // Where each patch sits: frame, row, column, and its attention window.
  std::vector<int> frame(n), row(n), col(n), window(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i;
    const int cc = static_cast<int>(rest % m);
    rest /= m;
    const int r = static_cast<int>(rest % m);
    rest /= m;
    const int bw = static_cast<int>(rest % (grid_w / m));
    rest /= grid_w / m;
    const int bh = static_cast<int>(rest % (grid_h / m));
    rest /= grid_h / m;
    frame[i] = static_cast<int>(rest);
    row[i] = bh * m + r;
    col[i] = bw * m + cc;
    window[i] = qwen2 ? 0 : (bh / window_units) * 1000 + bw / window_units;
  }

  Matrix pix = zeros(n, patch_dim);
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < patch_dim; ++k) {
      pix[i][k] = pixels[static_cast<size_t>(i * patch_dim + k)];
    }
  }
  Matrix x = linear(pix, src, p + "patch_embed.proj", false);

  for (int b = 0; b < c.depth; ++b) {
    const std::string block = p + "blocks." + std::to_string(b) + ".";
    const bool full =
        qwen2 || std::count(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), b) > 0;
    Matrix qkv = linear(normalize(x, src, block + "norm1", qwen2), src, block + "attn.qkv", true);
    // Rotary on q (offset 0) and k (offset e) of every head.
    for (int64_t i = 0; i < n; ++i) {
      for (int part = 0; part < 2; ++part) {
        for (int h = 0; h < heads; ++h) {
          double* v = &qkv[i][part * e + h * d];
          for (int k = 0; k < d / 2; ++k) {
            const int j = k % (d / 4);
            const double inv_freq = 1.0 / std::pow(10000.0, 2.0 * j / (d / 2.0));
            const double angle = (k < d / 4 ? row[i] : col[i]) * inv_freq;
            const double a = v[k];
            const double bb = v[k + d / 2];
            v[k] = a * std::cos(angle) - bb * std::sin(angle);
            v[k + d / 2] = bb * std::cos(angle) + a * std::sin(angle);
          }
        }
      }
    }
    Matrix attn = zeros(n, e);
    for (int h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> score(n, -INFINITY);
        double max_score = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (frame[j] != frame[i] || (!full && window[j] != window[i]))
            continue;
          double s = 0;
          for (int k = 0; k < d; ++k) {
            s += qkv[i][h * d + k] * qkv[j][e + h * d + k];
          }
          score[j] = s / std::sqrt(static_cast<double>(d));
          max_score = std::max(max_score, score[j]);
        }
        double total = 0;
        for (int64_t j = 0; j < n; ++j) {
          score[j] = std::exp(score[j] - max_score);
          total += score[j];
        }
        for (int64_t j = 0; j < n; ++j) {
          for (int k = 0; k < d; ++k) {
            attn[i][h * d + k] += score[j] / total * qkv[j][2 * e + h * d + k];
          }
        }
      }
    }
    Matrix out = linear(attn, src, block + "attn.proj", true);
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < e; ++k) {
        x[i][k] += out[i][k];
      }
    }
    Matrix h2 = normalize(x, src, block + "norm2", qwen2);
    Matrix mlp;
    if (qwen2) {
      Matrix a = linear(h2, src, block + "mlp.fc1", true);
      for (auto& r : a) {
        for (double& v : r) {
          v = v / (1.0 + std::exp(-1.702 * v));
        }
      }
      mlp = linear(a, src, block + "mlp.fc2", true);
    } else {
      Matrix gate = linear(h2, src, block + "mlp.gate_proj", true);
      Matrix up = linear(h2, src, block + "mlp.up_proj", true);
      for (size_t i = 0; i < gate.size(); ++i) {
        for (size_t k = 0; k < gate[i].size(); ++k) {
          gate[i][k] = gate[i][k] / (1.0 + std::exp(-gate[i][k])) * up[i][k];
        }
      }
      mlp = linear(gate, src, block + "mlp.down_proj", true);
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < e; ++k) {
        x[i][k] += mlp[i][k];
      }
    }
  }

  Matrix normed = normalize(x, src, p + "merger.ln_q", qwen2);
  Matrix grouped = zeros(n / unit, int64_t{unit} * e);
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < e; ++k) {
      grouped[i / unit][(i % unit) * e + k] = normed[i][k];
    }
  }
  Matrix hidden = linear(grouped, src, p + "merger.mlp.0", true);
  for (auto& r : hidden) {
    for (double& v : r) {
      v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    }
  }
  Matrix result = linear(hidden, src, p + "merger.mlp.2", true);
  std::vector<double> flat;
  for (const auto& r : result) {
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return flat;
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<VisionTransformer> load_or_die(const VisionConfig& c, const TensorSource& src,
                                               kernels::WeightFormat format, ThreadPool& pool) {
  Result<std::unique_ptr<VisionTransformer>> vt = VisionTransformer::load(c, src, {format}, pool);
  EXPECT_TRUE(vt.is_ok()) << vt.status().to_string();
  return vt.is_ok() ? std::move(vt).value() : nullptr;
}

// max |got - want| / max |want|.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double max_diff = 0;
  double max_want = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
    max_want = std::max(max_want, std::abs(want[i]));
  }
  return max_diff / max_want;
}

struct Grid {
  int t, h, w;
};

class VisionTransformerTest : public ::testing::TestWithParam<VisionArchitecture> {};

TEST_P(VisionTransformerTest, MatchesNaiveFloat64Reference) {
  const VisionConfig c = tiny_config(GetParam());
  const FakeTensorSource src = make_weights(c, "visual.", 7);
  ThreadPool pool(2);
  auto vt = load_or_die(c, src, kernels::WeightFormat::kF32, pool);
  ASSERT_NE(vt, nullptr);
  EXPECT_EQ(vt->weight_format(), kernels::WeightFormat::kF32);
  EXPECT_EQ(vt->config(), c);
  for (Grid g : {Grid{1, 8, 8}, Grid{1, 6, 10}, Grid{2, 4, 6}}) {
    const int64_t num_patches = int64_t{g.t} * g.h * g.w;
    const std::vector<float> pixels = Random(11).values(num_patches * c.patch_dim(), 1.5);
    std::vector<float> out;
    ASSERT_TRUE(vt->encode(pixels, g.t, g.h, g.w, out).is_ok());
    ASSERT_EQ(out.size(), static_cast<size_t>(num_patches / c.merge_unit() * c.out_hidden_size));
    const std::vector<double> want = reference_encode(c, src, pixels, g.t, g.h, g.w);
    EXPECT_LT(relative_error(out, want), 1e-5) << g.t << "x" << g.h << "x" << g.w;
  }
}

TEST_P(VisionTransformerTest, Bf16WeightsStayClose) {
  const VisionConfig c = tiny_config(GetParam());
  const FakeTensorSource src = make_weights(c, "visual.", 7);
  ThreadPool pool(2);
  auto vt = load_or_die(c, src, kernels::WeightFormat::kBF16, pool);
  ASSERT_NE(vt, nullptr);
  const std::vector<float> pixels = Random(11).values(int64_t{6 * 10} * c.patch_dim(), 1.5);
  std::vector<float> out;
  ASSERT_TRUE(vt->encode(pixels, 1, 6, 10, out).is_ok());
  EXPECT_LT(relative_error(out, reference_encode(c, src, pixels, 1, 6, 10)), 3e-2);
}

TEST_P(VisionTransformerTest, ResultsDoNotDependOnThreadCount) {
  const VisionConfig c = tiny_config(GetParam());
  const FakeTensorSource src = make_weights(c, "visual.", 3);
  const std::vector<float> pixels = Random(5).values(int64_t{8 * 6} * c.patch_dim(), 1.0);
  std::vector<float> outs[2];
  int i = 0;
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    auto vt = load_or_die(c, src, kernels::WeightFormat::kF32, pool);
    ASSERT_NE(vt, nullptr);
    ASSERT_TRUE(vt->encode(pixels, 1, 8, 6, outs[i++]).is_ok());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST_P(VisionTransformerTest, AcceptsModelVisualPrefix) {
  const VisionConfig c = tiny_config(GetParam());
  ThreadPool pool(1);
  auto plain = load_or_die(c, make_weights(c, "visual.", 9), kernels::WeightFormat::kF32, pool);
  auto nested =
      load_or_die(c, make_weights(c, "model.visual.", 9), kernels::WeightFormat::kF32, pool);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(nested, nullptr);
  const std::vector<float> pixels = Random(1).values(int64_t{4 * 4} * c.patch_dim(), 1.0);
  std::vector<float> a, b;
  ASSERT_TRUE(plain->encode(pixels, 1, 4, 4, a).is_ok());
  ASSERT_TRUE(nested->encode(pixels, 1, 4, 4, b).is_ok());
  EXPECT_EQ(a, b);
}

// The fingerprint the EC compatibility check carries: the same weights (any prefix, any
// format) give the same one, other weights of the same shape another.
TEST_P(VisionTransformerTest, WeightsFingerprintTellsCheckpointsApart) {
  const VisionConfig c = tiny_config(GetParam());
  ThreadPool pool(1);
  auto a = load_or_die(c, make_weights(c, "visual.", 9), kernels::WeightFormat::kF32, pool);
  auto same =
      load_or_die(c, make_weights(c, "model.visual.", 9), kernels::WeightFormat::kBF16, pool);
  auto other = load_or_die(c, make_weights(c, "visual.", 10), kernels::WeightFormat::kF32, pool);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(same, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(a->weights_fingerprint(), same->weights_fingerprint());
  EXPECT_NE(a->weights_fingerprint(), other->weights_fingerprint());
}

TEST_P(VisionTransformerTest, ShapeErrorsAreInvalidArgument) {
  const VisionConfig c = tiny_config(GetParam());
  ThreadPool pool(1);
  auto vt = load_or_die(c, make_weights(c, "visual.", 1), kernels::WeightFormat::kF32, pool);
  ASSERT_NE(vt, nullptr);
  std::vector<float> out;
  const std::vector<float> pixels(static_cast<size_t>(4 * 4 * c.patch_dim()), 0.5f);
  EXPECT_TRUE(vt->encode(pixels, 1, 4, 4, out).is_ok());
  EXPECT_EQ(out.size(), static_cast<size_t>(4 * c.out_hidden_size));
  // Too few / too many values for the grid.
  Status s = vt->encode(std::span(pixels).first(pixels.size() - 1), 1, 4, 4, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_EQ(vt->encode(pixels, 1, 4, 2, out).code(), StatusCode::kInvalidArgument);
  // Not a multiple of spatial_merge_size, empty grids.
  const std::vector<float> odd(static_cast<size_t>(3 * 4 * c.patch_dim()), 0.5f);
  s = vt->encode(odd, 1, 3, 4, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spatial_merge_size"), std::string::npos) << s.message();
  EXPECT_EQ(vt->encode({}, 0, 4, 4, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(vt->encode({}, 1, -2, 4, out).code(), StatusCode::kInvalidArgument);
}

TEST_P(VisionTransformerTest, MissingOrMisshapenTensorIsNamed) {
  const VisionConfig c = tiny_config(GetParam());
  ThreadPool pool(1);
  const std::string name = c.architecture == VisionArchitecture::kQwen2Vl
                               ? "visual.blocks.1.mlp.fc2.bias"
                               : "visual.blocks.1.mlp.up_proj.bias";
  FakeTensorSource missing = make_weights(c, "visual.", 1);
  missing.erase(name);
  Result<std::unique_ptr<VisionTransformer>> vt =
      VisionTransformer::load(c, missing, {kernels::WeightFormat::kF32}, pool);
  ASSERT_FALSE(vt.is_ok());
  EXPECT_EQ(vt.status().code(), StatusCode::kNotFound);
  EXPECT_NE(vt.status().message().find(name), std::string::npos) << vt.status().message();

  FakeTensorSource misshapen = make_weights(c, "visual.", 1);
  misshapen.tensors()["visual.merger.mlp.2.weight"].shape = {c.out_hidden_size + 1, 4};
  vt = VisionTransformer::load(c, misshapen, {kernels::WeightFormat::kF32}, pool);
  ASSERT_FALSE(vt.is_ok());
  EXPECT_EQ(vt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(vt.status().message().find("visual.merger.mlp.2.weight"), std::string::npos)
      << vt.status().message();

  // No tower at all: the error names the first tensor under the hub prefix.
  vt = VisionTransformer::load(c, FakeTensorSource(), {kernels::WeightFormat::kF32}, pool);
  ASSERT_FALSE(vt.is_ok());
  EXPECT_NE(vt.status().message().find("visual.patch_embed.proj.weight"), std::string::npos);

  VisionConfig bad = c;
  bad.num_heads = 3;
  vt = VisionTransformer::load(bad, missing, {kernels::WeightFormat::kF32}, pool);
  EXPECT_EQ(vt.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(VisionTransformerTest, FlopCounts) {
  const VisionConfig c = tiny_config(GetParam());
  ThreadPool pool(1);
  auto vt = load_or_die(c, make_weights(c, "visual.", 1), kernels::WeightFormat::kF32, pool);
  ASSERT_NE(vt, nullptr);
  const int64_t e = c.embed_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t mlp =
      c.architecture == VisionArchitecture::kQwen2Vl ? 2 * e * inter : 3 * e * inter;
  const int64_t merger = (4 * e * 4 * e + int64_t{c.out_hidden_size} * 4 * e) / 4;
  EXPECT_EQ(vt->num_weight_params(),
            e * c.patch_dim() + c.depth * (3 * e * e + e * e + mlp) + merger);
  // 6 x 10 patches: one frame of 60; Qwen2.5-VL windows of 2 x 2 units over 3 x 5 units:
  // two of 16 patches, three of 8 (right column and bottom row), one of 4 (corner).
  const int64_t frame = int64_t{60} * 60;
  int64_t want = 0;
  if (c.architecture == VisionArchitecture::kQwen2Vl) {
    want = int64_t{c.depth} * 2 * e * frame;
  } else {
    const int64_t windows = 2 * 16 * 16 + 3 * 8 * 8 + 4 * 4;
    want = 2 * 2 * e * frame + 2 * 2 * e * windows;
  }
  EXPECT_EQ(vt->attention_flops(1, 6, 10), want);
  EXPECT_EQ(vt->attention_flops(1, 5, 10), 0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, VisionTransformerTest,
                         ::testing::Values(VisionArchitecture::kQwen2Vl,
                                           VisionArchitecture::kQwen25Vl),
                         [](const ::testing::TestParamInfo<VisionArchitecture>& info) {
                           return info.param == VisionArchitecture::kQwen2Vl ? "Qwen2Vl"
                                                                             : "Qwen25Vl";
                         });

}  // namespace
}  // namespace crescent::model
