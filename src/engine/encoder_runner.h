#pragma once
// EncoderRunner: what the engine needs from a vision encoder. It turns one image's pixel
// patches into the embeddings that replace the image's placeholder tokens. Called from the
// engine's thread only.

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "engine/multimodal.h"

namespace crescent::engine {

class EncoderRunner {
 public:
  virtual ~EncoderRunner() = default;
  // Width of one embedding row (the language model's hidden size).
  virtual int hidden_size() const = 0;
  // Placeholder tokens (embedding rows) an image with this ViT patch grid becomes.
  virtual int num_tokens(int grid_t, int grid_h, int grid_w) const = 0;
  // [num_tokens][hidden_size] floats. InvalidArgument for an input of the wrong shape.
  virtual Result<std::vector<float>> encode(const EncoderInput& input) = 0;
};

}  // namespace crescent::engine
