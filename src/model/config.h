#pragma once
// The hyper-parameters of a decoder-only model (Llama, Qwen2, Qwen3) or of a vision-language
// one (Qwen2-VL, Qwen2.5-VL: a Qwen2 decoder with M-RoPE plus a vision tower), read from a
// Hugging Face config.json or built from GGUF metadata, and written back as config.json by
// make-model.
// Plain value type; no thread-safety concerns.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/vision_config.h"

namespace crescent::model {

// kQwen2Vl / kQwen25Vl: the language model is Qwen2's (QKV bias) with M-RoPE.
enum class Architecture { kLlama, kQwen2, kQwen3, kQwen2Vl, kQwen25Vl };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
// "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration".
std::string_view architecture_name(Architecture arch);
// "llama", "qwen2", "qwen3", "qwen2_vl", "qwen2_5_vl": the HF model_type.
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

  // Vision-language models only (empty / -1 otherwise).
  // M-RoPE: rotary frequency pairs [0, s0) turn with the temporal position, [s0, s0+s1) with
  // the height position, the rest with the width position (rope_scaling.mrope_section; the
  // sum is head_dim / 2).
  std::vector<int> mrope_section;
  std::optional<VisionConfig> vision;  // absent when the tower lives in a separate mmproj file
  int image_token_id = -1;             // <|image_pad|>: one per merged patch in the prompt
  int vision_start_token_id = -1;      // <|vision_start|>
  int vision_end_token_id = -1;        // <|vision_end|>

  bool is_multimodal() const { return !mrope_section.empty(); }

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
