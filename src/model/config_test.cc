#include "model/config.h"

#include <gtest/gtest.h>

#include "model/presets.h"

namespace crescent::model {
namespace {

// Qwen3-0.6B's config.json as published.
constexpr const char* kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Llama-3.2-1B's config.json as published.
constexpr const char* kLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

constexpr const char* kQwen2Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
  "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
  "max_position_embeddings": 32768, "vocab_size": 151936, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151643,
  "bos_token_id": 151643})";

TEST(ModelConfigTest, ParsesQwen3) {
  Result<ModelConfig> c = parse_model_config(kQwen3Config);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->architecture_name, "Qwen3ForCausalLM");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->head_dim, 128);  // explicit, not hidden / heads (64)
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_FALSE(c->rope_scaling.is_llama3);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->has_qk_norm);
  EXPECT_FALSE(c->has_qkv_bias);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{151645});
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, ParsesLlama32WithLlama3RopeScaling) {
  Result<ModelConfig> c = parse_model_config(kLlamaConfig);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_TRUE(c->rope_scaling.is_llama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_FALSE(c->has_qkv_bias);
  EXPECT_FALSE(c->has_qk_norm);
  EXPECT_EQ(c->max_position_embeddings, 131072);
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBiasAndDefaultsHeadDim) {
  Result<ModelConfig> c = parse_model_config(kQwen2Config);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->has_qkv_bias);
  EXPECT_EQ(c->head_dim, 64);  // 896 / 14
  EXPECT_TRUE(c->torch_dtype.empty());
}

TEST(ModelConfigTest, LlamaAttentionBias) {
  std::string text = kLlamaConfig;
  text.replace(text.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  Result<ModelConfig> c = parse_model_config(text);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->has_qkv_bias);
}

TEST(ModelConfigTest, UnknownArchitectureIsUnimplementedAndNamed) {
  Result<ModelConfig> c =
      parse_model_config(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 8})");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("MistralForCausalLM"), std::string::npos);
}

TEST(ModelConfigTest, MissingOrIllTypedFieldIsNamed) {
  std::string missing = kQwen2Config;
  missing.replace(missing.find("\"hidden_size\": 896,"), 19, "");
  Result<ModelConfig> c = parse_model_config(missing);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status().message();

  std::string ill = kQwen2Config;
  ill.replace(ill.find("\"num_hidden_layers\": 24"), 23, "\"num_hidden_layers\": \"24\"");
  c = parse_model_config(ill);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("num_hidden_layers"), std::string::npos);

  c = parse_model_config("{not json");
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, InconsistentHeadsRejected) {
  std::string text = kQwen2Config;
  text.replace(text.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  Result<ModelConfig> c = parse_model_config(text);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("num_key_value_heads"), std::string::npos);
}

TEST(ModelConfigTest, OtherRopeScalingIsUnimplemented) {
  std::string text = kLlamaConfig;
  text.replace(text.find("\"llama3\""), 8, "\"yarn\"");
  Result<ModelConfig> c = parse_model_config(text);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("yarn"), std::string::npos);
}

// Qwen/Qwen2-VL-2B-Instruct's config.json as published (LLM fields at the top level).
constexpr const char* kQwen2VlConfig = R"({
  "architectures": ["Qwen2VLForConditionalGeneration"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
  "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
  "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 1536,
  "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768,
  "max_window_layers": 28, "model_type": "qwen2_vl", "num_attention_heads": 12,
  "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": true,
  "use_sliding_window": false,
  "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                    "in_chans": 3, "hidden_size": 1536, "patch_size": 14,
                    "spatial_merge_size": 2, "spatial_patch_size": 14,
                    "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "vocab_size": 151936})";

// Qwen/Qwen2.5-VL-3B-Instruct's config.json as published.
constexpr const char* kQwen25VlConfig = R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
  "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
  "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 128000,
  "max_window_layers": 70, "model_type": "qwen2_5_vl", "num_attention_heads": 16,
  "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": true,
  "use_sliding_window": false,
  "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
                    "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                    "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                    "spatial_patch_size": 14, "window_size": 112,
                    "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                    "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "vocab_size": 151936})";

// The layout newer transformers write: the LLM under text_config, "rope_type": "default".
constexpr const char* kNestedQwen25VlConfig = R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
  "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
  "vision_end_token_id": 151653, "torch_dtype": "bfloat16", "transformers_version": "4.53.1",
  "text_config": {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl_text",
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 2048,
    "image_token_id": null, "intermediate_size": 11008, "max_position_embeddings": 128000,
    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": null,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936},
  "vision_config": {"depth": 32, "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu",
                    "hidden_size": 1280, "in_channels": 3, "in_chans": 3,
                    "intermediate_size": 3420, "model_type": "qwen2_5_vl", "num_heads": 16,
                    "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                    "spatial_patch_size": 14, "temporal_patch_size": 2,
                    "tokens_per_second": 2, "window_size": 112}})";

void replace_once(std::string& text, std::string_view from, std::string_view to) {
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
}

TEST(ModelConfigTest, ParsesQwen2VlHubConfig) {
  Result<ModelConfig> c = parse_model_config(kQwen2VlConfig);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kQwen2Vl);
  EXPECT_TRUE(c->is_multimodal());
  EXPECT_TRUE(c->has_qkv_bias);
  EXPECT_FALSE(c->has_qk_norm);
  EXPECT_FALSE(c->rope_scaling.is_llama3);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->mrope_section, (std::vector<int>{16, 24, 24}));
  EXPECT_EQ(c->image_token_id, 151655);
  EXPECT_EQ(c->vision_start_token_id, 151652);
  EXPECT_EQ(c->vision_end_token_id, 151653);
  ASSERT_TRUE(c->vision.has_value());
  const VisionConfig& v = *c->vision;
  EXPECT_EQ(v.architecture, VisionArchitecture::kQwen2Vl);
  EXPECT_EQ(v.depth, 32);
  EXPECT_EQ(v.embed_dim, 1280);
  EXPECT_EQ(v.num_heads, 16);
  EXPECT_EQ(v.head_dim(), 80);
  EXPECT_EQ(v.intermediate_size, 5120);  // embed_dim * mlp_ratio
  EXPECT_EQ(v.out_hidden_size, 1536);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(v.temporal_patch_size, 2);
  EXPECT_EQ(v.spatial_merge_size, 2);
  EXPECT_EQ(v.in_channels, 3);
  EXPECT_EQ(v.patch_dim(), 1176);
  EXPECT_EQ(v.window_size, 0);
  EXPECT_TRUE(v.fullatt_block_indexes.empty());
}

TEST(ModelConfigTest, ParsesQwen25VlHubConfig) {
  Result<ModelConfig> c = parse_model_config(kQwen25VlConfig);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kQwen25Vl);
  EXPECT_EQ(c->architecture_name, "Qwen2_5_VLForConditionalGeneration");
  EXPECT_TRUE(c->has_qkv_bias);
  EXPECT_EQ(c->mrope_section, (std::vector<int>{16, 24, 24}));
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  ASSERT_TRUE(c->vision.has_value());
  const VisionConfig& v = *c->vision;
  EXPECT_EQ(v.architecture, VisionArchitecture::kQwen25Vl);
  EXPECT_EQ(v.embed_dim, 1280);
  EXPECT_EQ(v.intermediate_size, 3420);
  EXPECT_EQ(v.out_hidden_size, 2048);
  EXPECT_EQ(v.window_size, 112);
  EXPECT_EQ(v.fullatt_block_indexes, (std::vector<int>{7, 15, 23, 31}));
}

TEST(ModelConfigTest, VisionLanguageFieldsNestedUnderTextConfig) {
  Result<ModelConfig> nested = parse_model_config(kNestedQwen25VlConfig);
  ASSERT_TRUE(nested.is_ok()) << nested.status().to_string();
  Result<ModelConfig> flat = parse_model_config(kQwen25VlConfig);
  ASSERT_TRUE(flat.is_ok());
  EXPECT_EQ(*nested, *flat);

  // A top-level field wins over text_config's.
  std::string both = kNestedQwen25VlConfig;
  replace_once(both, R"("model_type": "qwen2_5_vl",)",
               R"("model_type": "qwen2_5_vl", "max_position_embeddings": 4096,)");
  Result<ModelConfig> c = parse_model_config(both);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->max_position_embeddings, 4096);

  // The ids fall back to Qwen's when the file has none.
  std::string no_ids = kNestedQwen25VlConfig;
  replace_once(no_ids, R"("image_token_id": 151655,)", "");
  replace_once(no_ids, R"("vision_start_token_id": 151652,)", "");
  replace_once(no_ids, R"("image_token_id": null,)", "");
  c = parse_model_config(no_ids);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->image_token_id, 151655);
  EXPECT_EQ(c->vision_start_token_id, 151652);
}

TEST(ModelConfigTest, BadMropeSectionRejected) {
  std::string text = kQwen2VlConfig;
  replace_once(text, "[16, 24, 24]", "[16, 24, 16]");
  Result<ModelConfig> c = parse_model_config(text);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("mrope_section"), std::string::npos) << c.status().message();

  text = kQwen2VlConfig;
  replace_once(text, R"("rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},)", "");
  c = parse_model_config(text);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("mrope_section"), std::string::npos);

  text = kQwen2VlConfig;
  replace_once(text, R"("type": "mrope")", R"("type": "yarn")");
  c = parse_model_config(text);
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
}

TEST(ModelConfigTest, BadVisionSizesRejectedAndNamed) {
  struct Case {
    const char* config;
    const char* from;
    const char* to;
    const char* named;
  };
  const Case cases[] = {
      {kQwen2VlConfig, R"("num_heads": 16)", R"("num_heads": 12)", "num_heads"},
      {kQwen2VlConfig, R"("embed_dim": 1280)", R"("embed_dim": 1296)", "head_dim"},  // 81
      {kQwen2VlConfig, R"("depth": 32)", R"("depth": 0)", "depth"},
      {kQwen2VlConfig, R"("embed_dim": 1280,)", "", "embed_dim"},
      {kQwen2VlConfig, R"(3, "hidden_size": 1536)", R"(3, "hidden_size": 1024)", "width"},
      {kQwen25VlConfig, "[7, 15, 23, 31]", "[7, 15, 23, 32]", "fullatt_block_indexes"},
      {kQwen25VlConfig, R"("window_size": 112)", R"("window_size": 14)", "window_size"},
      {kQwen25VlConfig, R"("patch_size": 14,)", R"("patch_size": -14,)", "patch_size"},
  };
  for (const Case& k : cases) {
    std::string text = k.config;
    replace_once(text, k.from, k.to);
    Result<ModelConfig> c = parse_model_config(text);
    ASSERT_FALSE(c.is_ok()) << k.to;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find(k.named), std::string::npos) << c.status().message();
  }

  std::string gelu = kQwen25VlConfig;
  replace_once(gelu, R"("hidden_act": "silu", "hidden_size": 1280)",
               R"("hidden_act": "gelu", "hidden_size": 1280)");
  EXPECT_EQ(parse_model_config(gelu).status().code(), StatusCode::kUnimplemented);
}

ModelConfig tiny_vision_language(Architecture arch) {
  ModelConfig c;
  c.architecture = arch;
  c.architecture_name = std::string(architecture_name(arch));
  c.vocab_size = 151936;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.has_qkv_bias = true;
  c.max_position_embeddings = 4096;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645, 151643};
  c.torch_dtype = "bfloat16";
  c.mrope_section = {2, 3, 3};
  c.image_token_id = 151655;
  c.vision_start_token_id = 151652;
  c.vision_end_token_id = 151653;
  VisionConfig v;
  v.depth = 4;
  v.embed_dim = 32;
  v.num_heads = 2;
  v.intermediate_size = 64;
  v.out_hidden_size = 64;
  if (arch == Architecture::kQwen25Vl) {
    v.architecture = VisionArchitecture::kQwen25Vl;
    v.intermediate_size = 88;
    v.window_size = 56;
    v.fullatt_block_indexes = {1, 3};
  }
  c.vision = v;
  return c;
}

TEST(ModelConfigTest, VisionLanguageConfigsRoundTripThroughConfigJson) {
  for (Architecture arch : {Architecture::kQwen2Vl, Architecture::kQwen25Vl}) {
    ModelConfig expected = tiny_vision_language(arch);
    ASSERT_TRUE(validate_model_config(expected).is_ok())
        << validate_model_config(expected).to_string();
    std::string text = to_config_json(expected);
    Result<ModelConfig> c = parse_model_config(text);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string() << "\n" << text;
    EXPECT_EQ(*c, expected) << text;
    // The hub layout: LLM fields at the top level, M-RoPE as rope_scaling type mrope.
    EXPECT_NE(text.find(R"("type": "mrope")"), std::string::npos) << text;
    EXPECT_EQ(text.find("text_config"), std::string::npos);
    EXPECT_NE(text.find(std::string(R"("model_type": ")") +
                        std::string(architecture_model_type(arch)) + "\""),
              std::string::npos);
  }
  // The language model is Qwen2's; the tower must match the architecture and feed its width.
  ModelConfig no_bias = tiny_vision_language(Architecture::kQwen2Vl);
  no_bias.has_qkv_bias = false;
  EXPECT_EQ(validate_model_config(no_bias).code(), StatusCode::kInvalidArgument);
  ModelConfig wrong_tower = tiny_vision_language(Architecture::kQwen2Vl);
  wrong_tower.vision = tiny_vision_language(Architecture::kQwen25Vl).vision;
  EXPECT_EQ(validate_model_config(wrong_tower).code(), StatusCode::kInvalidArgument);
  ModelConfig text_only = tiny_vision_language(Architecture::kQwen2Vl);
  text_only.architecture = Architecture::kQwen2;
  EXPECT_EQ(validate_model_config(text_only).code(), StatusCode::kInvalidArgument);
  // A Qwen2-VL MLP width that is not a whole multiple of embed_dim survives mlp_ratio.
  ModelConfig odd = tiny_vision_language(Architecture::kQwen2Vl);
  odd.vision->intermediate_size = 85;
  Result<ModelConfig> c = parse_model_config(to_config_json(odd));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->vision->intermediate_size, 85);
  // Without a tower (it lives in an mmproj file) the config still round-trips.
  ModelConfig no_tower = tiny_vision_language(Architecture::kQwen25Vl);
  no_tower.vision.reset();
  c = parse_model_config(to_config_json(no_tower));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(*c, no_tower);
}

TEST(ModelConfigTest, EveryPresetRoundTripsThroughConfigJson) {
  for (const ModelPreset& p : model_presets()) {
    ModelConfig expected = p.config;
    expected.torch_dtype = "bfloat16";
    Result<ModelConfig> c = parse_model_config(to_config_json(expected));
    ASSERT_TRUE(c.is_ok()) << p.name << ": " << c.status().to_string();
    EXPECT_EQ(*c, expected) << p.name;
  }
}

}  // namespace
}  // namespace crescent::model
