#include "engine/multimodal.h"

#include <algorithm>

#include "core/fnv.h"

namespace crescent::engine {

Status validate_multimodal_items(std::span<const MultiModalItem> items, int num_prompt_tokens,
                                 bool require_inputs) {
  int previous_end = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const MultiModalItem& item = items[i];
    const std::string name = "image " + std::to_string(i);
    if (item.mm_hash.empty()) {
      return invalid_argument(name + " has no mm_hash");
    }
    if (item.llm_grid_t < 1 || item.llm_grid_h < 1 || item.llm_grid_w < 1 ||
        int64_t{item.llm_grid_t} * item.llm_grid_h * item.llm_grid_w != item.num_tokens) {
      return invalid_argument(
          name + ": " + std::to_string(item.num_tokens) +
          " placeholder tokens do not match its grid " + std::to_string(item.llm_grid_t) + "x" +
          std::to_string(item.llm_grid_h) + "x" + std::to_string(item.llm_grid_w));
    }
    if (item.offset < previous_end || item.end() > num_prompt_tokens) {
      return invalid_argument(name + ": placeholder tokens [" + std::to_string(item.offset) + ", " +
                              std::to_string(item.end()) +
                              ") overlap another image or leave the prompt of " +
                              std::to_string(num_prompt_tokens) + " tokens");
    }
    if (require_inputs && !item.input && !item.embeddings) {
      return invalid_argument(name + " has neither pixel values nor embeddings");
    }
    previous_end = item.end();
  }
  return Status::ok();
}

std::vector<int32_t> mrope_positions(int num_tokens, std::span<const MultiModalItem> items,
                                     int* delta) {
  std::vector<int32_t> pos(static_cast<size_t>(num_tokens) * 3);
  auto set = [&](int index, int32_t t, int32_t h, int32_t w) {
    pos[static_cast<size_t>(index) * 3] = t;
    pos[static_cast<size_t>(index) * 3 + 1] = h;
    pos[static_cast<size_t>(index) * 3 + 2] = w;
  };
  int32_t next = 0;  // position of the next text token
  int index = 0;
  for (const MultiModalItem& item : items) {
    for (; index < item.offset; ++index, ++next) {
      set(index, next, next, next);
    }
    const int32_t start = next;
    for (int t = 0; t < item.llm_grid_t; ++t) {
      for (int h = 0; h < item.llm_grid_h; ++h) {
        for (int w = 0; w < item.llm_grid_w; ++w) {
          set(index++, start + t, start + h, start + w);
        }
      }
    }
    next = start + std::max({item.llm_grid_t, item.llm_grid_h, item.llm_grid_w});
  }
  for (; index < num_tokens; ++index, ++next) {
    set(index, next, next, next);
  }
  *delta = next - num_tokens;
  return pos;
}

uint64_t mm_hash_key(const std::string& mm_hash) {
  // The mm_hash is already a strong content hash; this only folds it to 64 bits.
  return fnv1a64(mm_hash);
}

}  // namespace crescent::engine
