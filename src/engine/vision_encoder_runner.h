#pragma once
// VisionEncoderRunner: the engine's EncoderRunner over a real model::VisionTransformer (the
// Qwen2-VL / Qwen2.5-VL vision tower and patch merger). Not thread-safe: the engine's thread
// calls encode().

#include <memory>

#include "engine/encoder_runner.h"
#include "model/vision_transformer.h"

namespace crescent::engine {

class VisionEncoderRunner : public EncoderRunner {
 public:
  explicit VisionEncoderRunner(model::VisionTransformer& tower) : tower_(tower) {}

  int hidden_size() const override { return tower_.config().out_hidden_size; }
  int num_tokens(int grid_t, int grid_h, int grid_w) const override {
    return grid_t * grid_h * grid_w / tower_.config().merge_unit();
  }
  Result<std::vector<float>> encode(const EncoderInput& input) override {
    std::vector<float> out;
    RETURN_IF_ERROR(
        tower_.encode(input.pixel_values, input.grid_t, input.grid_h, input.grid_w, out));
    return out;
  }

 private:
  model::VisionTransformer& tower_;
};

}  // namespace crescent::engine
