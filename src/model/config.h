#pragma once
// The hyper-parameters of a decoder-only model (Llama, Qwen2, Qwen3), read from a Hugging Face
// config.json or built from GGUF metadata, and written back as config.json by make-model.
// Plain value type; no thread-safety concerns.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::model {

enum class Architecture { kLlama, kQwen2, kQwen3 };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM".
std::string_view architecture_name(Architecture arch);
// "llama", "qwen2", "qwen3": the HF model_type and GGUF general.architecture.
std::string_view architecture_model_type(Architecture arch);

// Llama-3 style frequency-dependent RoPE scaling ("rope_type": "llama3").
struct RopeScaling {
  bool is_llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 1.0;
  int original_max_position_embeddings = 0;

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as in config.json, e.g. "Qwen3ForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // default hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool has_qkv_bias = false;  // Qwen2 always; Llama's attention_bias
  bool has_qk_norm = false;   // Qwen3
  int max_position_embeddings = 0;
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;  // "bfloat16", "float16", "float32" (may be empty)

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Parses a config.json. Unknown architecture or RoPE scaling type -> Unimplemented;
// a missing or ill-typed field -> InvalidArgument naming it; inconsistent sizes ->
// InvalidArgument.
Result<ModelConfig> parse_model_config(std::string_view config_json);

// Checks the invariants every loader relies on (positive sizes, heads divide evenly, ...).
Status validate_model_config(const ModelConfig& config);

// A config.json that transformers and parse_model_config() both read.
std::string to_config_json(const ModelConfig& config);

// A generation_config.json with the bos/eos ids.
std::string to_generation_config_json(const ModelConfig& config);

}  // namespace crescent::model
