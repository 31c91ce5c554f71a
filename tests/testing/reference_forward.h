#pragma once
// A plain double-precision forward pass of the Llama/Qwen2/Qwen3 transformer, written for the
// tests only: no kernels, no paging, no threads, straight from the HF formulas. It is the
// independent reference the engine's logits are checked against.

#include <cstdint>
#include <vector>

#include "model/model_files.h"

namespace crescent::testing {

// Logits (vocab doubles) of every position of `tokens`, which start at position 0.
std::vector<std::vector<double>> reference_logits(const model::ModelFiles& files,
                                                  const std::vector<int32_t>& tokens);

}  // namespace crescent::testing
