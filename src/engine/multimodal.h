#pragma once
// The engine's view of a request's images (vision-language models): where each image's
// placeholder tokens sit in the prompt, the grid that gives them their M-RoPE positions, the
// content hash that keys the encoder cache and the prefix cache, and the encoder's input.
// The engine never decodes or preprocesses an image: the server does, and hands over the
// pixel patches. Plain value types; the shared inputs are immutable once built.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::engine {

// What the vision encoder turns into embeddings: one image's pixel patches, as the image
// processor lays them out ([grid_t * grid_h * grid_w][patch_dim]), grid in ViT patches.
struct EncoderInput {
  std::vector<float> pixel_values;
  int grid_t = 1;
  int grid_h = 0;
  int grid_w = 0;
};

struct MultiModalItem {
  std::string mm_hash;  // content hash of the decoded pixels and preprocessing parameters
  int offset = 0;       // index of the first placeholder token in the prompt
  int num_tokens = 0;   // placeholder tokens = embedding rows = llm_grid_t * h * w
  // The grid in LLM tokens (ViT patches merged spatial_merge_size x spatial_merge_size).
  int llm_grid_t = 1;
  int llm_grid_h = 0;
  int llm_grid_w = 0;
  // The encoder's input; may be null when the embeddings come another way (the encoder cache
  // already holds mm_hash, or they were pulled from an encoder worker).
  std::shared_ptr<const EncoderInput> input;
  // Precomputed embeddings ([num_tokens][hidden]); when set, the encoder is not run.
  std::shared_ptr<const std::vector<float>> embeddings;

  int end() const { return offset + num_tokens; }
};

// Checks that items are ordered, disjoint, inside a prompt of num_prompt_tokens, that each
// one's token count equals its grid, and (require_inputs) that each has an encoder input or
// embeddings; a decode engine whose prompt KV comes from a prefill engine needs neither.
// InvalidArgument naming the item otherwise.
Status validate_multimodal_items(std::span<const MultiModalItem> items, int num_prompt_tokens,
                                 bool require_inputs = true);

// Qwen2-VL's 3-D position ids (transformers' get_rope_index for images): text tokens count up
// on all three axes; an image's tokens sit at (start + t, start + h, start + w) where start is
// the position after the preceding text, and the text after the image continues at
// start + max(grid_t, grid_h, grid_w). Returns [num_tokens][3] and sets *delta so that a later
// token at index i has position i + delta on all three axes.
std::vector<int32_t> mrope_positions(int num_tokens, std::span<const MultiModalItem> items,
                                     int* delta);

// 64 bits of an mm_hash for the prefix cache's block keys.
uint64_t mm_hash_key(const std::string& mm_hash);

}  // namespace crescent::engine
