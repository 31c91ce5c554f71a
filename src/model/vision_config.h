#pragma once
// The vision tower of a Qwen2-VL / Qwen2.5-VL checkpoint (config.json "vision_config", or the
// clip.vision.* keys of llama.cpp's mmproj GGUF), and the LLM-side multimodal settings beside
// it: M-RoPE sections and the special token ids that frame an image in the prompt.
// Plain value types; no thread-safety concerns.

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::model {

enum class VisionArchitecture {
  kQwen2Vl,   // LayerNorm + quick_gelu MLP blocks, full attention everywhere
  kQwen25Vl,  // RMSNorm + SwiGLU (biased) blocks, window attention except fullatt blocks
};
// "qwen2_vl" / "qwen2_5_vl" (the vision_config's model_type).
std::string_view vision_architecture_name(VisionArchitecture arch);

struct VisionConfig {
  VisionArchitecture architecture = VisionArchitecture::kQwen2Vl;
  int depth = 0;              // ViT blocks
  int embed_dim = 0;          // ViT width (Qwen2-VL "embed_dim", Qwen2.5-VL "hidden_size")
  int num_heads = 0;          // embed_dim / num_heads = head_dim (must be divisible by 4)
  int intermediate_size = 0;  // MLP width (Qwen2-VL: embed_dim * mlp_ratio)
  int out_hidden_size = 0;    // merger output = the LLM's hidden_size
  int patch_size = 14;
  int temporal_patch_size = 2;
  int spatial_merge_size = 2;
  int in_channels = 3;
  // Qwen2.5-VL only: attention within windows of window_size pixels (window_size /
  // spatial_merge_size / patch_size merged units per side), except in these blocks.
  int window_size = 0;
  std::vector<int> fullatt_block_indexes;
  double norm_eps = 1e-6;
  // Normalisation the image processor applies (also stored in mmproj GGUF files).
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};

  int head_dim() const { return embed_dim / num_heads; }
  // Values per flattened patch: in_channels * temporal_patch_size * patch_size^2.
  int patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // ViT tokens merged into one LLM token.
  int merge_unit() const { return spatial_merge_size * spatial_merge_size; }

  friend bool operator==(const VisionConfig&, const VisionConfig&) = default;
};

// Checks positive sizes, head_dim % 4 == 0 (2-D rotary), fullatt indexes within depth, and
// for Qwen2.5-VL a window of at least one merged unit (window_size >= spatial_merge_size *
// patch_size). Qwen2-VL configs must leave window_size / fullatt_block_indexes unset.
// InvalidArgument naming the field.
Status validate_vision_config(const VisionConfig& config);

// config.json's "vision_config" object in either architecture's key names (Qwen2-VL:
// depth, embed_dim, num_heads, mlp_ratio, hidden_size = out_hidden_size, in_chans /
// in_channels, hidden_act "quick_gelu"; Qwen2.5-VL: depth, hidden_size = embed_dim,
// intermediate_size, num_heads, out_hidden_size, window_size, fullatt_block_indexes,
// hidden_act "silu"). Omitted fields take transformers' defaults, except the output width,
// which defaults to llm_hidden_size. Errors name the field ("vision_config.depth"); another
// hidden_act is Unimplemented. The result is validated.
Result<VisionConfig> parse_vision_config_json(const nlohmann::json& vision_config,
                                              VisionArchitecture arch, int llm_hidden_size);
// The "vision_config" object transformers reads for config.architecture (the hub layout, plus
// "in_channels", which is the key transformers' config classes take).
nlohmann::json vision_config_to_json(const VisionConfig& config);

}  // namespace crescent::model
