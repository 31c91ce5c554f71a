#pragma once
// `crescent quantize`: rewrites a model as a GGUF file of another weight type. The input is a
// GGUF file of any type crescent loads (its tensors are dequantised and quantised again) or a
// Hugging Face checkout (what make-model --gguf-type converts). Tensor types per
// gguf_tensor_dtype() (gguf_types.h: llama-quantize's rules, the _M mixes included).
//
// Metadata: a GGUF input's keys are all copied as they are (tokenizer, chat template, authors,
// crescent.*), except general.file_type and general.quantization_version, which describe the
// new file; a checkout gets the keys make-model writes (tokenizer.json, tokenizer_config.json's
// chat template). A vision-language model's tower is not written: it stays in its mmproj file.

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "model/gguf_types.h"

namespace crescent::model {

struct QuantizeOptions {
  std::string input;   // a .gguf file, or a model directory as open_model() takes it
  std::string output;  // the .gguf file to write
  GgufWeightType type;
  // An existing output is AlreadyExists unless this is set; the input itself is never
  // overwritten. The file is written beside the output and renamed into place when complete.
  bool overwrite = false;
  std::function<void(int64_t done_bytes, int64_t total_bytes)> progress;
};

Status quantize_model(const QuantizeOptions& options);

}  // namespace crescent::model
