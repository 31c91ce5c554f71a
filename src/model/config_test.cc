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
