#pragma once
// Opens a model from disk: a Hugging Face checkout (config.json + model.safetensors or a
// sharded model.safetensors.index.json, tokenizer.json, tokenizer_config.json) or a GGUF file
// (config from its metadata, tokenizer files looked up beside it). The result owns the tensor
// source; it is immutable and may be shared between threads.

#include <memory>
#include <string>

#include "model/config.h"
#include "model/tensor_source.h"

namespace crescent::model {

struct ModelFiles {
  ModelConfig config;
  std::unique_ptr<TensorSource> tensors;
  std::string tokenizer_json_path;    // always present
  std::string tokenizer_config_path;  // empty if the checkout has none
  std::string name;                   // directory name, or GGUF general.name
};

// `path` is a directory or a .gguf file. In a directory, safetensors win over a GGUF file; a
// directory holding no safetensors and exactly one *.gguf opens that file.
Result<ModelFiles> open_model(const std::string& path);

}  // namespace crescent::model
