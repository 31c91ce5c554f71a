#pragma once
// Opens a model from disk: a Hugging Face checkout (config.json + model.safetensors or a
// sharded model.safetensors.index.json, tokenizer.json, tokenizer_config.json) or a GGUF file
// (config and tokenizer from its metadata; a tokenizer.json beside it takes precedence). A
// vision-language model also brings its vision tower: from the checkout's own "visual.*" tensors,
// or for a GGUF from llama.cpp's mmproj file. The result owns its tensor sources; it is immutable
// and may be shared between threads.

#include <memory>
#include <string>

#include "model/chat_template.h"
#include "model/config.h"
#include "model/tensor_source.h"
#include "model/tokenizer.h"

namespace crescent::model {

struct ModelFiles {
  ModelConfig config;  // config.vision is set for a vision-language model
  std::unique_ptr<TensorSource> tensors;
  // The vision tower under HF names ("visual.blocks.0.attn.qkv.weight", ...); null for text
  // models. An HF checkout gets a second handle on its own safetensors (the same mapped pages,
  // so it lives independently of `tensors`); a GGUF model gets the mmproj file's source.
  std::unique_ptr<TensorSource> vision_tensors;
  // Where the tokenizer comes from: tokenizer.json, or else (a GGUF model only) the GGUF's own
  // tokenizer.* metadata, tokenizer_from_gguf() in tokenizer_gguf.h. Exactly one is set.
  std::string tokenizer_json_path;
  std::string tokenizer_gguf_path;
  std::string tokenizer_config_path;     // empty if the checkout has none
  std::string directory;                 // the checkout, or the directory holding the .gguf
  std::string preprocessor_config_path;  // preprocessor_config.json beside the model, or empty
  std::string name;                      // directory name, or GGUF general.name
};

// `path` is a directory or a .gguf file. In a directory, safetensors win over a GGUF file; a
// directory holding no safetensors and exactly one *.gguf besides mmproj*.gguf opens that file.
// A GGUF whose general.architecture is "qwen2vl" needs its mmproj: `mmproj_path`, else the one
// mmproj*.gguf in the same directory (NotFound if there is none, InvalidArgument if several);
// the projector type then tells Qwen2-VL from Qwen2.5-VL. `mmproj_path` for a text model or an
// HF checkout (which carries its own tower) -> InvalidArgument.
// Tokenizer of a GGUF model: a tokenizer.json in the same directory wins (with the
// tokenizer_config.json beside it), so a user can override an embedded tokenizer crescent cannot
// read (SentencePiece) or fix a broken one; without it the GGUF's metadata is used, and a GGUF
// with neither is NotFound.
Result<ModelFiles> open_model(const std::string& path, const std::string& mmproj_path = "");

// The tokenizer `files` names: tokenizer.json, or the GGUF's metadata, whose tokenizer config
// (special token strings, tokenizer.chat_template) then goes to `gguf_config` when given.
Result<std::unique_ptr<Tokenizer>> open_tokenizer(const ModelFiles& files,
                                                  TokenizerConfig* gguf_config = nullptr);

// The tokenizer of whatever open_model(path) would open, without mapping its weights: a
// checkout, a .gguf file, a directory holding one; or a tokenizer.json file itself.
Result<std::unique_ptr<Tokenizer>> open_tokenizer(const std::string& path);

}  // namespace crescent::model
