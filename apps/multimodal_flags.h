#pragma once
// The `crescent serve` flags for image input (vLLM's names where vLLM has them), and the
// MultimodalProcessor they make for a loaded vision-language model.

#include <memory>
#include <string>

#include "apps/flags.h"
#include "engine/loader.h"
#include "server/multimodal_processor.h"

namespace crescent::apps {

struct MultimodalFlags {
  std::string allowed_local_media_path;
  bool allow_remote_media = false;
  std::string limit_mm_per_prompt;  // "image=N" or '{"image": N}'
  int64_t max_image_pixels = 50'000'000;
  int64_t max_image_mb = 20;
  double remote_media_timeout_s = 5;

  void add_to(FlagParser& flags);
  // Null for a text-only model. InvalidArgument for bad flag values.
  Result<std::shared_ptr<const server::MultimodalProcessor>> make_processor(
      const engine::LoadedEngine& loaded) const;
};

// "image=4", "image=4,video=0" or '{"image": 4}' -> 4; other modalities must be 0.
Result<int> parse_limit_mm_per_prompt(const std::string& text, int default_limit);

}  // namespace crescent::apps
