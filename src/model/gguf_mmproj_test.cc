#include "model/gguf_mmproj.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "model/gguf.h"
#include "model/make_model.h"
#include "model/presets.h"
#include "model/safetensors.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

class GgufMmprojTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("gguf_mmproj_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The tower of `preset` as F32 safetensors (HF names).
  VisionConfig write_tower(const std::string& preset, const std::string& file) {
    const ModelConfig c = find_model_preset(preset)->config;
    std::vector<std::vector<float>> data;
    std::vector<TensorView> views;
    for (const TensorSpec& s : vision_tensor_specs(*c.vision)) {
      int64_t n = 1;
      for (int64_t d : s.shape)
        n *= d;
      data.emplace_back(static_cast<size_t>(n));
      generate_weights(c, s, /*seed=*/11, 0, n, data.back().data());
      views.push_back({s.name, DType::kF32, s.shape, data.back().data(), n * 4});
    }
    EXPECT_TRUE(write_safetensors(path(file), views).is_ok());
    return *c.vision;
  }

  // A minimal clip file: the metadata open_mmproj needs, `edit` applied last, no tensors.
  std::string write_clip(const std::string& name, const std::function<void(GgufWriter&)>& edit) {
    GgufWriter w(path(name));
    w.set_string("general.architecture", "clip");
    w.set_bool("clip.has_vision_encoder", true);
    w.set_string("clip.projector_type", "qwen2.5vl_merger");
    for (const char* key : {"clip.vision.embedding_length", "clip.vision.block_count",
                            "clip.vision.attention.head_count", "clip.vision.projection_dim"}) {
      w.set_u32(key, 32);
    }
    w.set_u32("clip.vision.patch_size", 14);
    w.set_f32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
    w.set_f32_array("clip.vision.image_mean", {0.5f, 0.5f, 0.5f});
    w.set_f32_array("clip.vision.image_std", {0.5f, 0.5f, 0.5f});
    if (edit)
      edit(w);
    EXPECT_TRUE(w.finish().is_ok());
    return path(name);
  }

  fs::path dir_;
};

TEST_F(GgufMmprojTest, RoundTripsEveryTensorBitForBit) {
  for (const char* preset : {"tiny-qwen2-vl", "tiny-qwen2.5-vl"}) {
    const VisionConfig vision = write_tower(preset, "tower.safetensors");
    auto hf = SafetensorsFile::open(path("tower.safetensors"));
    ASSERT_TRUE(hf.is_ok());
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      SCOPED_TRACE(std::string(preset) + " " + std::string(dtype_name(dtype)));
      ASSERT_TRUE(write_mmproj_gguf(path("mmproj.gguf"), vision, **hf, dtype, preset).is_ok());
      VisionConfig read;
      Result<std::unique_ptr<TensorSource>> mm = open_mmproj(path("mmproj.gguf"), &read);
      ASSERT_TRUE(mm.is_ok()) << mm.status().to_string();
      EXPECT_EQ(read, vision);
      const std::vector<TensorSpec> specs = vision_tensor_specs(vision);
      EXPECT_EQ((*mm)->names().size(), specs.size());
      for (const TensorSpec& spec : specs) {
        Result<TensorView> a = require_tensor(**hf, spec.name, spec.shape);
        Result<TensorView> b = require_tensor(**mm, spec.name, spec.shape);
        ASSERT_TRUE(b.is_ok()) << b.status().to_string();
        std::vector<float> want = tensor_to_float(*a);
        const std::vector<float> got = tensor_to_float(*b);
        // What the file's type keeps of each value: 1-D tensors and the patch embedding are
        // F32 (F16 in an F16 file); Q8_0 is checked to within its step.
        DType stored = b->dtype;
        if (stored == DType::kQ8_0) {
          float amax = 0;
          for (float x : want)
            amax = std::max(amax, std::fabs(x));
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[i], want[i], amax / 127.0f) << spec.name;
          continue;
        }
        for (float& x : want) {
          if (stored == DType::kF16)
            x = f16_to_float(float_to_f16(x));
          if (stored == DType::kBF16)
            x = bf16_to_float(float_to_bf16(x));
        }
        EXPECT_EQ(got, want) << spec.name;
      }
    }
  }
}

TEST_F(GgufMmprojTest, WritesLlamaCppNamesTypesAndKeys) {
  const VisionConfig vision = write_tower("tiny-qwen2.5-vl", "tower.safetensors");
  auto hf = SafetensorsFile::open(path("tower.safetensors"));
  ASSERT_TRUE(hf.is_ok());
  ASSERT_TRUE(write_mmproj_gguf(path("mmproj.gguf"), vision, **hf, DType::kBF16, "tiny").is_ok());
  auto f = GgufFile::open(path("mmproj.gguf"));
  ASSERT_TRUE(f.is_ok());
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_string("general.architecture").value(), "clip");
  EXPECT_EQ(g.get_string("clip.projector_type").value(), "qwen2.5vl_merger");
  EXPECT_TRUE(g.get_bool("clip.has_vision_encoder").value());
  EXPECT_TRUE(g.get_bool("clip.use_silu").value());
  EXPECT_EQ(g.get_int("clip.vision.n_wa_pattern").value(), 2);  // fullatt {1, 3}
  EXPECT_EQ(g.get_int("clip.vision.window_size").value(), 56);
  EXPECT_EQ(g.get_int("clip.vision.embedding_length").value(), 32);
  EXPECT_EQ(g.get_int("clip.vision.feed_forward_length").value(), 64);
  EXPECT_EQ(g.get_int("clip.vision.projection_dim").value(), 64);
  EXPECT_EQ(g.get_int("clip.vision.block_count").value(), 4);
  EXPECT_EQ(g.get_int("clip.vision.attention.head_count").value(), 2);
  EXPECT_EQ(static_cast<float>(g.get_float_array("clip.vision.image_mean").value()[0]),
            0.48145466f);

  std::map<std::string, std::pair<uint32_t, std::vector<int64_t>>> infos;
  for (const GgufTensorInfo& t : g.tensor_infos())
    infos[t.name] = {t.ggml_type, t.dims};
  // The Conv3d split into its two temporal slices, F32, dims fastest first: [p, p, C, embed].
  const std::vector<int64_t> patch_dims = {14, 14, 3, 32};
  EXPECT_EQ(infos["v.patch_embd.weight"], std::make_pair(kGgmlTypeF32, patch_dims));
  EXPECT_EQ(infos["v.patch_embd.weight.1"], std::make_pair(kGgmlTypeF32, patch_dims));
  const std::vector<int64_t> square = {32, 32};
  for (const char* name : {"v.blk.0.attn_q.weight", "v.blk.0.attn_k.weight",
                           "v.blk.3.attn_v.weight", "v.blk.2.attn_out.weight"}) {
    EXPECT_EQ(infos[name], std::make_pair(kGgmlTypeBF16, square)) << name;
  }
  const std::vector<int64_t> up = {32, 64};
  EXPECT_EQ(infos["v.blk.1.ffn_gate.weight"], std::make_pair(kGgmlTypeBF16, up));
  EXPECT_EQ(infos["v.blk.1.ffn_up.weight"], std::make_pair(kGgmlTypeBF16, up));
  const std::vector<int64_t> bias = {32};
  EXPECT_EQ(infos["v.blk.0.attn_k.bias"], std::make_pair(kGgmlTypeF32, bias));
  EXPECT_EQ(infos["v.blk.0.ln1.weight"], std::make_pair(kGgmlTypeF32, bias));
  EXPECT_EQ(infos["v.post_ln.weight"], std::make_pair(kGgmlTypeF32, bias));
  const std::vector<int64_t> mm0 = {128, 128}, mm2 = {128, 64};
  EXPECT_EQ(infos["mm.0.weight"], std::make_pair(kGgmlTypeBF16, mm0));
  EXPECT_EQ(infos["mm.2.weight"], std::make_pair(kGgmlTypeBF16, mm2));
  // RMSNorm: no norm biases in Qwen2.5-VL; no leftover HF names.
  EXPECT_EQ(infos.count("v.blk.0.ln1.bias"), 0u);
  EXPECT_EQ(infos.count("v.post_ln.bias"), 0u);
  // 4 blocks x (ln1, ln2, q/k/v/out weight+bias, gate/up/down weight+bias) + 2 patch + post_ln
  // + mm.0/mm.2 weight+bias.
  EXPECT_EQ(infos.size(), 4u * (2 + 8 + 6) + 2 + 1 + 4);
}

TEST_F(GgufMmprojTest, Qwen2VlHasLayerNormBiasesAndQuickGelu) {
  const VisionConfig vision = write_tower("tiny-qwen2-vl", "tower.safetensors");
  auto hf = SafetensorsFile::open(path("tower.safetensors"));
  ASSERT_TRUE(write_mmproj_gguf(path("mmproj.gguf"), vision, **hf, DType::kF16, "t").is_ok());
  auto f = GgufFile::open(path("mmproj.gguf"));
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ((*f)->get_string("clip.projector_type").value(), "qwen2vl_merger");
  // quick_gelu is clip.cpp's default: neither activation flag is set.
  EXPECT_FALSE((*f)->has_key("clip.use_silu"));
  EXPECT_FALSE((*f)->has_key("clip.use_gelu"));
  EXPECT_FALSE((*f)->has_key("clip.vision.n_wa_pattern"));
  EXPECT_EQ((*f)->get_by_gguf_name("v.patch_embd.weight")->dtype, DType::kF16);
  EXPECT_TRUE((*f)->get_by_gguf_name("v.blk.1.ln2.bias").is_ok());
  EXPECT_TRUE((*f)->get_by_gguf_name("v.post_ln.bias").is_ok());
  EXPECT_TRUE((*f)->get_by_gguf_name("v.blk.1.ffn_down.weight").is_ok());
  EXPECT_FALSE((*f)->get_by_gguf_name("v.blk.1.ffn_gate.weight").is_ok());
}

TEST_F(GgufMmprojTest, ReadsLlamaCppConventions) {
  // llama.cpp's converter writes Qwen2-VL's LLM width as feed_forward_length and no window
  // size; the MLP width comes from ffn_up and the window from clip.cpp's default.
  const VisionConfig vision = write_tower("tiny-qwen2.5-vl", "tower.safetensors");
  auto hf = SafetensorsFile::open(path("tower.safetensors"));
  ASSERT_TRUE(write_mmproj_gguf(path("mmproj.gguf"), vision, **hf, DType::kF32, "t").is_ok());
  auto original = GgufFile::open(path("mmproj.gguf"));
  ASSERT_TRUE(original.is_ok());
  // Rewrite the file without clip.vision.window_size and with the quirky FFN width.
  GgufWriter w(path("llamacpp.gguf"));
  w.set_string("general.architecture", "clip");
  w.set_bool("clip.has_vision_encoder", true);
  w.set_string("clip.projector_type", "qwen2.5vl_merger");
  w.set_u32("clip.vision.embedding_length", 32);
  w.set_u32("clip.vision.feed_forward_length", 64 * 99);
  w.set_u32("clip.vision.block_count", 4);
  w.set_u32("clip.vision.attention.head_count", 2);
  w.set_u32("clip.vision.projection_dim", 64);
  w.set_u32("clip.vision.patch_size", 14);
  w.set_u32("clip.vision.n_wa_pattern", 2);
  w.set_f32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
  w.set_f32_array("clip.vision.image_mean", {0.48145466f, 0.4578275f, 0.40821073f});
  w.set_f32_array("clip.vision.image_std", {0.26862954f, 0.26130258f, 0.27577711f});
  for (const GgufTensorInfo& t : (*original)->tensor_infos()) {
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    ASSERT_TRUE(w.add_tensor(t.name, DType::kF32, shape).is_ok());
  }
  ASSERT_TRUE(w.write_header().is_ok());
  for (const GgufTensorInfo& t : (*original)->tensor_infos()) {
    TensorView v = *(*original)->get_by_gguf_name(t.name);
    ASSERT_TRUE(w.write_data(v.data, v.num_bytes).is_ok());
  }
  ASSERT_TRUE(w.finish().is_ok());
  VisionConfig read;
  ASSERT_TRUE(open_mmproj(path("llamacpp.gguf"), &read).is_ok());
  VisionConfig expected = vision;
  expected.window_size = 112;
  EXPECT_EQ(read, expected);
}

TEST_F(GgufMmprojTest, ClearErrorsForBadFiles) {
  VisionConfig c;
  std::ofstream(path("junk.gguf")) << "definitely not a gguf file";
  Result<std::unique_ptr<TensorSource>> r = open_mmproj(path("junk.gguf"), &c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("junk.gguf"), std::string::npos);

  // An LLM GGUF is not an mmproj.
  {
    GgufWriter w(path("text.gguf"));
    w.set_string("general.architecture", "qwen2vl");
    ASSERT_TRUE(w.finish().is_ok());
  }
  r = open_mmproj(path("text.gguf"), &c);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not an mmproj file"), std::string::npos);
  EXPECT_NE(r.status().message().find("qwen2vl"), std::string::npos);

  std::string other = write_clip("other.gguf", {});
  {
    GgufWriter w(path("mlp.gguf"));
    w.set_string("general.architecture", "clip");
    w.set_bool("clip.has_vision_encoder", true);
    w.set_string("clip.projector_type", "mlp");
    ASSERT_TRUE(w.finish().is_ok());
  }
  r = open_mmproj(path("mlp.gguf"), &c);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("'mlp'"), std::string::npos);

  {
    GgufWriter w(path("audio.gguf"));
    w.set_string("general.architecture", "clip");
    w.set_bool("clip.has_audio_encoder", true);
    ASSERT_TRUE(w.finish().is_ok());
  }
  r = open_mmproj(path("audio.gguf"), &c);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no vision encoder"), std::string::npos);

  // Qwen2.5-VL without n_wa_pattern (write_clip sets no tensors and no pattern).
  r = open_mmproj(other, &c);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("clip.vision.n_wa_pattern"), std::string::npos);

  // Metadata fine, tensors missing.
  std::string no_tensors =
      write_clip("empty.gguf", [](GgufWriter& w) { w.set_u32("clip.vision.n_wa_pattern", 2); });
  r = open_mmproj(no_tensors, &c);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("v.blk.0.ffn_up.weight"), std::string::npos);
}

TEST_F(GgufMmprojTest, WrongShapeAndUnsupportedTypeAreNamed) {
  const VisionConfig vision = write_tower("tiny-qwen2-vl", "tower.safetensors");
  auto hf = SafetensorsFile::open(path("tower.safetensors"));
  ASSERT_TRUE(write_mmproj_gguf(path("mmproj.gguf"), vision, **hf, DType::kF32, "t").is_ok());
  auto original = GgufFile::open(path("mmproj.gguf"));
  ASSERT_TRUE(original.is_ok());
  // Copies the file, changing one tensor: `shape` (HF order) or, if empty, its type to IQ2_XXS
  // (a type whose size the reader does not know, so it holds no bytes here).
  auto copy_with = [&](const std::string& name, const std::string& target,
                       std::vector<int64_t> shape) {
    GgufWriter w(path(target));
    for (const char* key : {"general.architecture", "clip.projector_type"})
      w.set_string(key, *(*original)->get_string(key));
    w.set_bool("clip.has_vision_encoder", true);
    for (const char* key : {"clip.vision.embedding_length", "clip.vision.block_count",
                            "clip.vision.attention.head_count", "clip.vision.projection_dim",
                            "clip.vision.patch_size"}) {
      w.set_u32(key, static_cast<uint32_t>(*(*original)->get_int(key)));
    }
    w.set_f32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
    w.set_f32_array("clip.vision.image_mean", {0.5f, 0.5f, 0.5f});
    w.set_f32_array("clip.vision.image_std", {0.5f, 0.5f, 0.5f});
    for (const GgufTensorInfo& t : (*original)->tensor_infos()) {
      std::vector<int64_t> hf_shape(t.dims.rbegin(), t.dims.rend());
      if (t.name != name) {
        ASSERT_TRUE(w.add_tensor(t.name, DType::kF32, hf_shape).is_ok());
      } else if (!shape.empty()) {
        ASSERT_TRUE(w.add_tensor(t.name, DType::kF32, shape).is_ok());
      } else {
        ASSERT_TRUE(w.add_tensor_raw(t.name, 16, hf_shape, 0).is_ok());
      }
    }
    ASSERT_TRUE(w.write_header().is_ok());
    for (const GgufTensorInfo& t : (*original)->tensor_infos()) {
      TensorView v = *(*original)->get_by_gguf_name(t.name);
      int64_t n = v.num_bytes;
      if (t.name == name)
        n = shape.empty() ? 0 : dtype_num_bytes(DType::kF32, shape[0] * shape[1]);
      std::vector<uint8_t> bytes(static_cast<size_t>(n), 0);
      ASSERT_TRUE(w.write_data(bytes.data(), n).is_ok());
    }
    ASSERT_TRUE(w.finish().is_ok());
  };
  copy_with("v.blk.1.attn_k.weight", "shape.gguf", {32, 16});
  VisionConfig c;
  Result<std::unique_ptr<TensorSource>> r = open_mmproj(path("shape.gguf"), &c);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      r.status().message().find("v.blk.1.attn_k.weight has shape [32, 16], expected [32, 32]"),
      std::string::npos)
      << r.status().to_string();

  // A ggml type crescent cannot compute with fails on get(), naming tensor and type.
  copy_with("v.blk.1.attn_out.weight", "iq2.gguf", {});
  r = open_mmproj(path("iq2.gguf"), &c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Result<TensorView> v = (*r)->get("visual.blocks.1.attn.proj.weight");
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(v.status().message().find("IQ2_XXS"), std::string::npos);
  EXPECT_TRUE((*r)->get("visual.blocks.1.attn.qkv.weight").is_ok());
  EXPECT_EQ((*r)->get("visual.nothing").status().code(), StatusCode::kNotFound);
}

TEST_F(GgufMmprojTest, WriterRejectsWhatClipCannotExpress) {
  VisionConfig vision = write_tower("tiny-qwen2.5-vl", "tower.safetensors");
  auto hf = SafetensorsFile::open(path("tower.safetensors"));
  vision.fullatt_block_indexes = {1};  // {1, 3} is what n_wa_pattern 2 means for 4 blocks
  Status s = write_mmproj_gguf(path("m.gguf"), vision, **hf, DType::kF32, "t");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n_wa_pattern"), std::string::npos);
  vision.fullatt_block_indexes = {1, 3};
  vision.intermediate_size = 65;  // shapes no longer match the source
  s = write_mmproj_gguf(path("m.gguf"), vision, **hf, DType::kF32, "t");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("visual.blocks.0.mlp.gate_proj.weight"), std::string::npos);
}

}  // namespace
}  // namespace crescent::model
