#include "model/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_mmproj.h"
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
              std::optional<GgufWeightType> gguf = std::nullopt) {
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

TEST_F(MakeModelTest, VisionLanguagePresetsWriteTheHfCheckoutAndTheGgufPair) {
  for (const char* preset : {"tiny-qwen2-vl", "tiny-qwen2.5-vl"}) {
    SCOPED_TRACE(preset);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(make(preset, preset, 1).is_ok());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 20.0);  // about a second in Release
    const fs::path dir = dir_ / preset;
    for (const char* f :
         {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json", "preprocessor_config.json", "model.gguf", "mmproj.gguf"}) {
      EXPECT_TRUE(fs::exists(dir / f)) << f;
    }
    const ModelPreset p = *find_model_preset(preset);
    ModelConfig expected = p.config;
    expected.torch_dtype = "bfloat16";
    ASSERT_TRUE(expected.vision.has_value());
    const VisionConfig& vision = *expected.vision;

    // config.json round-trips, vision_config included.
    Result<ModelConfig> parsed = parse_model_config(read_all(dir / "config.json"));
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    EXPECT_EQ(*parsed, expected);

    // The processor and chat template a Qwen2-VL checkout ships.
    auto pre = nlohmann::json::parse(read_all(dir / "preprocessor_config.json"));
    EXPECT_EQ(pre["image_processor_type"], "Qwen2VLImageProcessor");
    EXPECT_EQ(pre["min_pixels"], 3136);
    EXPECT_EQ(pre["max_pixels"], 28 * 28 * 64);
    EXPECT_EQ(pre["patch_size"], 14);
    EXPECT_EQ(pre["temporal_patch_size"], 2);
    EXPECT_EQ(pre["merge_size"], 2);
    EXPECT_EQ(pre["do_normalize"], true);
    EXPECT_EQ(pre["rescale_factor"].get<double>(), 1.0 / 255.0);
    EXPECT_EQ(pre["image_mean"][0].get<double>(), 0.48145466);
    EXPECT_EQ(pre["image_std"][2].get<double>(), 0.27577711);
    EXPECT_NE(read_all(dir / "preprocessor_config.json").find("0.48145466,"), std::string::npos);
    auto tok_config = nlohmann::json::parse(read_all(dir / "tokenizer_config.json"));
    EXPECT_EQ(tok_config["chat_template"], p.chat_template);
    EXPECT_NE(p.chat_template.find("<|vision_start|><|image_pad|><|vision_end|>"),
              std::string::npos);

    // The HF checkout: the LLM and the tower, with the shapes transformers expects.
    Result<ModelFiles> hf = open_model(dir.string());
    ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
    EXPECT_EQ(hf->config, expected);
    ASSERT_NE(hf->vision_tensors, nullptr);
    EXPECT_EQ(hf->preprocessor_config_path, (dir / "preprocessor_config.json").string());
    const std::vector<TensorSpec> visual = vision_tensor_specs(vision);
    EXPECT_EQ(hf->tensors->names().size(), model_tensor_specs(expected).size());
    ASSERT_TRUE(require_tensor(*hf->vision_tensors, "visual.patch_embed.proj.weight",
                               {vision.embed_dim, 3, 2, 14, 14})
                    .is_ok());
    ASSERT_TRUE(require_tensor(*hf->vision_tensors, "visual.merger.mlp.0.weight",
                               {4 * vision.embed_dim, 4 * vision.embed_dim})
                    .is_ok());
    ASSERT_TRUE(require_tensor(*hf->vision_tensors, "visual.merger.mlp.2.weight",
                               {64, 4 * vision.embed_dim})
                    .is_ok());

    // The GGUF pair: model.gguf (arch qwen2vl, M-RoPE sections) and mmproj.gguf (clip).
    auto llm = GgufFile::open((dir / "model.gguf").string());
    ASSERT_TRUE(llm.is_ok());
    EXPECT_EQ((*llm)->get_string("general.architecture").value(), "qwen2vl");
    EXPECT_EQ((*llm)->get_int_array("qwen2vl.rope.dimension_sections").value(),
              (std::vector<int64_t>{2, 3, 3, 0}));
    for (const GgufTensorInfo& t : (*llm)->tensor_infos())
      EXPECT_EQ(t.name.rfind("v.", 0), std::string::npos) << t.name;
    auto mm = GgufFile::open((dir / "mmproj.gguf").string());
    ASSERT_TRUE(mm.is_ok());
    EXPECT_EQ((*mm)->get_string("general.architecture").value(), "clip");
    EXPECT_EQ((*mm)->get_string("clip.projector_type").value(),
              mmproj_projector_type(vision.architecture));

    Result<ModelFiles> gguf = open_model((dir / "model.gguf").string());
    ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
    EXPECT_EQ(gguf->config, expected);
    ASSERT_NE(gguf->vision_tensors, nullptr);
    EXPECT_EQ(gguf->preprocessor_config_path, hf->preprocessor_config_path);
    EXPECT_EQ(gguf->vision_tensors->names().size(), visual.size());
    for (const TensorSpec& spec : model_tensor_specs(expected)) {
      const bool is_visual = spec.name.rfind("visual.", 0) == 0;
      const TensorSource& a_src = is_visual ? *hf->vision_tensors : *hf->tensors;
      const TensorSource& b_src = is_visual ? *gguf->vision_tensors : *gguf->tensors;
      Result<TensorView> a = require_tensor(a_src, spec.name, spec.shape);
      Result<TensorView> b = require_tensor(b_src, spec.name, spec.shape);
      ASSERT_TRUE(a.is_ok()) << a.status().to_string();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      EXPECT_EQ(a->dtype, DType::kBF16);
      // BF16 -> BF16 (2-D), F32 (1-D and the patch embedding): exact either way.
      EXPECT_EQ(tensor_to_float(*a), tensor_to_float(*b)) << spec.name;
    }

    // Same seed, same bytes (the mmproj and the processor config included).
    ASSERT_TRUE(make(preset, std::string(preset) + "-again", 1).is_ok());
    for (const char* f : {"mmproj.gguf", "model.gguf", "preprocessor_config.json",
                          "tokenizer_config.json", "config.json"}) {
      EXPECT_EQ(read_all(dir / f), read_all(dir_ / (std::string(preset) + "-again") / f)) << f;
    }
  }
}

TEST_F(MakeModelTest, RealVisionLanguagePresetsHaveTheCheckpointsShapes) {
  const ModelConfig q2 = find_model_preset("qwen2-vl-2b")->config;
  EXPECT_EQ(q2.architecture, Architecture::kQwen2Vl);
  EXPECT_EQ(q2.hidden_size, 1536);
  EXPECT_EQ(q2.num_hidden_layers, 28);
  EXPECT_EQ(q2.intermediate_size, 8960);
  EXPECT_EQ(q2.mrope_section, (std::vector<int>{16, 24, 24}));
  EXPECT_EQ(q2.vision->embed_dim, 1280);
  EXPECT_EQ(q2.vision->intermediate_size, 5120);
  EXPECT_EQ(q2.vision->out_hidden_size, 1536);
  const ModelConfig q25 = find_model_preset("qwen2.5-vl-3b")->config;
  EXPECT_EQ(q25.architecture, Architecture::kQwen25Vl);
  EXPECT_EQ(q25.hidden_size, 2048);
  EXPECT_EQ(q25.num_hidden_layers, 36);
  EXPECT_EQ(q25.intermediate_size, 11008);
  EXPECT_EQ(q25.max_position_embeddings, 128000);
  EXPECT_EQ(q25.vision->intermediate_size, 3420);
  EXPECT_EQ(q25.vision->fullatt_block_indexes, (std::vector<int>{7, 15, 23, 31}));
  EXPECT_EQ(q25.vision->window_size, 112);
  for (const ModelConfig* c : {&q2, &q25}) {
    EXPECT_TRUE(validate_model_config(*c).is_ok());
    EXPECT_TRUE(validate_vision_config(*c->vision).is_ok());
    int64_t visual = 0;
    for (const TensorSpec& s : vision_tensor_specs(*c->vision)) {
      int64_t n = 1;
      for (int64_t d : s.shape)
        n *= d;
      visual += n;
    }
    EXPECT_NEAR(static_cast<double>(visual), 6.7e8, 0.1e8);  // both towers: ~670M parameters
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

  // The vision tower: norms around 1, the residual-stream projections scaled by its own depth.
  c = find_model_preset("qwen2-vl-2b")->config;
  auto [vm, vs] = stats("visual.blocks.0.norm1.weight", {1280});
  EXPECT_NEAR(vm, 1.0, 0.01);
  auto [lm, ls] = stats("visual.merger.ln_q.weight", {1280});
  EXPECT_NEAR(lm, 1.0, 0.01);
  auto [pm, ps] = stats("visual.blocks.0.attn.proj.weight", {256, 256});
  EXPECT_NEAR(ps, 0.02 / std::sqrt(64.0), 1e-3);
  auto [fm, fs] = stats("visual.blocks.0.mlp.fc2.weight", {256, 256});
  EXPECT_NEAR(fs, 0.02 / std::sqrt(64.0), 1e-3);
  auto [em, es] = stats("visual.patch_embed.proj.weight", {64, 3, 2, 14, 14});
  EXPECT_NEAR(es, 0.02, 1e-3);
  auto [bm, bs] = stats("visual.blocks.0.attn.qkv.bias", {3840});
  EXPECT_NEAR(bs, 0.01, 1e-3);
}

// --gguf-type q4_k_m on a vision-language preset: the LLM file is llama-quantize's mix (its
// 64-wide rows fall back to Q5_0 / Q8_0), mmproj.gguf is Q8_0.
TEST_F(MakeModelTest, QuantMixGgufAndItsMmproj) {
  ASSERT_TRUE(make("tiny-qwen2-vl", "km", 3, *parse_gguf_weight_type("q4_k_m")).is_ok());
  auto gguf = GgufFile::open((dir_ / "km" / "model.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ((*gguf)->get_int("general.file_type").value(), 15);
  EXPECT_EQ((*gguf)->get("model.embed_tokens.weight")->dtype, DType::kQ8_0);  // tied output
  EXPECT_EQ((*gguf)->get("model.layers.1.self_attn.q_proj.weight")->dtype, DType::kQ5_0);
  EXPECT_EQ((*gguf)->get("model.layers.1.mlp.down_proj.weight")->dtype, DType::kQ8_0);
  auto mmproj = GgufFile::open((dir_ / "km" / "mmproj.gguf").string());
  ASSERT_TRUE(mmproj.is_ok()) << mmproj.status().to_string();
  for (const GgufTensorInfo& t : (*mmproj)->tensor_infos()) {
    EXPECT_TRUE(t.ggml_type == kGgmlTypeQ8_0 || t.ggml_type == kGgmlTypeF32) << t.name;
  }
  MakeModelOptions o;
  o.out_dir = (dir_ / "bad").string();
  o.dtype = DType::kQ4_K;
  EXPECT_EQ(make_model(o).code(), StatusCode::kInvalidArgument);  // safetensors cannot
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
