#include "model/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/gguf.h"
#include "model/model_files.h"
#include "model/presets.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("make_model_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Status make(const std::string& preset, const std::string& sub, uint64_t seed,
              std::optional<DType> gguf = std::nullopt) {
    MakeModelOptions o;
    o.preset = preset;
    o.out_dir = (dir_ / sub).string();
    o.seed = seed;
    o.gguf_dtype = gguf;
    return make_model(o);
  }
  fs::path dir_;
};

TEST_F(MakeModelTest, SameSeedSameBytesAndTinyIsFast) {
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(make("tiny", "a", 42).is_ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(make("tiny", "b", 42).is_ok());
  ASSERT_TRUE(make("tiny", "c", 43).is_ok());
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "tokenizer_config.json", "model.gguf"}) {
    ASSERT_TRUE(fs::exists(dir_ / "a" / f)) << f;
    EXPECT_EQ(read_all(dir_ / "a" / f), read_all(dir_ / "b" / f)) << f;
  }
  EXPECT_NE(read_all(dir_ / "a" / "model.safetensors"), read_all(dir_ / "c" / "model.safetensors"));
  EXPECT_EQ(
      read_all(dir_ / "a" / "tokenizer.json"),
      read_all(fs::path(default_tokenizer_dir(*find_model_preset("tiny"))) / "tokenizer.json"));
  // Generous for sanitizer builds on a shared machine; about 0.5 s in Release.
  EXPECT_LT(seconds, 20.0);
  RecordProperty("tiny_seconds", std::to_string(seconds));
}

TEST_F(MakeModelTest, EveryTinyPresetOpensBothWaysWithTheSameWeights) {
  for (const char* preset : {"tiny", "tiny-qwen2", "tiny-llama"}) {
    ASSERT_TRUE(make(preset, preset, 1).is_ok()) << preset;
    ModelConfig expected = find_model_preset(preset)->config;
    expected.torch_dtype = "bfloat16";

    Result<ModelFiles> hf = open_model((dir_ / preset).string());
    ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
    EXPECT_EQ(hf->config, expected) << preset;
    EXPECT_EQ(hf->name, preset);
    EXPECT_TRUE(fs::exists(hf->tokenizer_json_path));
    EXPECT_TRUE(fs::exists(hf->tokenizer_config_path));

    Result<ModelFiles> gguf = open_model((dir_ / preset / "model.gguf").string());
    ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
    EXPECT_EQ(gguf->config, expected) << preset;
    EXPECT_EQ(gguf->name, preset);
    EXPECT_EQ(gguf->tokenizer_json_path, hf->tokenizer_json_path);

    for (const TensorSpec& spec : model_tensor_specs(expected)) {
      Result<TensorView> a = require_tensor(*hf->tensors, spec.name, spec.shape);
      Result<TensorView> b = require_tensor(*gguf->tensors, spec.name, spec.shape);
      ASSERT_TRUE(a.is_ok()) << a.status().to_string();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      EXPECT_EQ(a->dtype, DType::kBF16);
      // BF16 -> BF16 (2-D) or F32 (1-D): exact either way.
      EXPECT_EQ(tensor_to_float(*a), tensor_to_float(*b)) << preset << " " << spec.name;
    }
    EXPECT_EQ(hf->tensors->names().size(), model_tensor_specs(expected).size());
  }
}

TEST_F(MakeModelTest, WeightStatisticsAreSane) {
  ModelConfig c = find_model_preset("small")->config;
  auto stats = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorSpec spec{name, shape};
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    generate_weights(c, spec, 5, 0, n, v.data());
    double sum = 0, sq = 0;
    for (float x : v)
      sum += x;
    const double mean = sum / n;
    for (float x : v)
      sq += (x - mean) * (x - mean);
    // The generator is counter-based: any sub-range gives the same values.
    std::vector<float> part(10);
    generate_weights(c, spec, 5, n / 2, 10, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), v.data() + n / 2, 40));
    return std::pair<double, double>(mean, std::sqrt(sq / n));
  };
  auto [qm, qs] = stats("model.layers.0.self_attn.q_proj.weight", {256, 256});
  EXPECT_NEAR(qm, 0.0, 1e-3);
  EXPECT_NEAR(qs, 0.02, 1e-3);
  auto [om, os] = stats("model.layers.0.self_attn.o_proj.weight", {256, 256});
  EXPECT_NEAR(os, 0.02 / std::sqrt(8.0), 1e-3);
  auto [nm, ns] = stats("model.layers.0.input_layernorm.weight", {256});
  EXPECT_NEAR(nm, 1.0, 0.01);
}

TEST_F(MakeModelTest, Q8GgufAndErrors) {
  ASSERT_TRUE(make("tiny", "q8", 3, DType::kQ8_0).is_ok());
  auto gguf = GgufFile::open((dir_ / "q8" / "model.gguf").string());
  ASSERT_TRUE(gguf.is_ok());
  EXPECT_EQ((*gguf)->get("model.embed_tokens.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ((*gguf)->get("model.norm.weight")->dtype, DType::kF32);
  EXPECT_EQ((*gguf)->get_array_size("tokenizer.ggml.tokens").value(), 151936);

  Status s = make("no-such-preset", "x", 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tiny-llama"), std::string::npos);  // lists the known ones
  MakeModelOptions o;
  o.out_dir = (dir_ / "y").string();
  o.tokenizer_dir = (dir_ / "nowhere").string();
  s = make_model(o);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace crescent::model
