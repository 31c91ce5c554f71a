#include "apps/multimodal_flags.h"

#include <nlohmann/json.hpp>

namespace crescent::apps {

void MultimodalFlags::add_to(FlagParser& flags) {
  flags.add("allowed-local-media-path", &allowed_local_media_path,
            "image_url parts may name file:// URLs inside this directory (default: refused)");
  flags.add("allow-remote-media", &allow_remote_media,
            "fetch http:// image URLs (off by default: the server would fetch what clients name)");
  flags.add("remote-media-timeout-s", &remote_media_timeout_s,
            "with --allow-remote-media: the whole fetch of one image must finish in this time");
  flags.add("limit-mm-per-prompt", &limit_mm_per_prompt,
            "most images in one request, as image=N or '{\"image\": N}' (default 8)");
  flags.add("max-image-pixels", &max_image_pixels,
            "largest decoded image (width x height) accepted, before resizing");
  flags.add("max-image-mb", &max_image_mb, "largest encoded image (PNG/JPEG/WebP bytes), in MiB");
}

Result<int> parse_limit_mm_per_prompt(const std::string& text, int default_limit) {
  if (text.empty()) {
    return default_limit;
  }
  int image_limit = default_limit;
  auto take = [&](const std::string& modality, int64_t n) -> Status {
    if (n < 0 || n > 1'000'000) {
      return invalid_argument("--limit-mm-per-prompt: " + modality + " limit " + std::to_string(n) +
                              " is out of range");
    }
    if (modality == "image") {
      image_limit = static_cast<int>(n);
    } else if (n != 0) {
      return invalid_argument("--limit-mm-per-prompt: crescent takes images only, not '" +
                              modality + "'");
    }
    return Status::ok();
  };
  if (text.front() == '{') {
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return invalid_argument("--limit-mm-per-prompt: not a JSON object: " + text);
    }
    for (const auto& [key, value] : j.items()) {
      if (!value.is_number_integer()) {
        return invalid_argument("--limit-mm-per-prompt: '" + key + "' must be an integer");
      }
      RETURN_IF_ERROR(take(key, value.get<int64_t>()));
    }
    return image_limit;
  }
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) {
      end = text.size();
    }
    const std::string item = text.substr(begin, end - begin);
    const size_t eq = item.find('=');
    char* parse_end = nullptr;
    const std::string number = eq == std::string::npos ? "" : item.substr(eq + 1);
    const long long n = std::strtoll(number.c_str(), &parse_end, 10);
    if (eq == std::string::npos || number.empty() || *parse_end != '\0') {
      return invalid_argument("--limit-mm-per-prompt: expected image=N, got '" + item + "'");
    }
    RETURN_IF_ERROR(take(item.substr(0, eq), n));
    begin = end + 1;
  }
  return image_limit;
}

Result<std::shared_ptr<const server::MultimodalProcessor>> MultimodalFlags::make_processor(
    const engine::LoadedEngine& loaded) const {
  if (!loaded.takes_images()) {
    return std::shared_ptr<const server::MultimodalProcessor>();
  }
  // From the config, not the tower: a decode server prepares images without loading it.
  const model::ModelConfig& config = loaded.config;
  const model::VisionConfig& vision = *loaded.config.vision;
  media::ImageProcessorConfig processor;
  if (!loaded.preprocessor_config_json.empty()) {
    auto parsed = media::parse_preprocessor_config(loaded.preprocessor_config_json);
    if (!parsed.is_ok()) {
      return parsed.status().with_context("preprocessor_config.json");
    }
    processor = *parsed;
  } else {
    // A GGUF pair carries no preprocessor_config.json: the tower's own normalisation and the
    // reference processor's defaults.
    processor.image_mean = vision.image_mean;
    processor.image_std = vision.image_std;
    processor.patch_size = vision.patch_size;
    processor.temporal_patch_size = vision.temporal_patch_size;
    processor.merge_size = vision.spatial_merge_size;
  }
  if (processor.patch_size != vision.patch_size ||
      processor.temporal_patch_size != vision.temporal_patch_size) {
    return invalid_argument("preprocessor_config.json patches (" +
                            std::to_string(processor.patch_size) + ", temporal " +
                            std::to_string(processor.temporal_patch_size) +
                            ") differ from the vision tower's");
  }
  server::MultimodalOptions options;
  ASSIGN_OR_RETURN(options.max_images_per_prompt,
                   parse_limit_mm_per_prompt(limit_mm_per_prompt, 8));
  if (max_image_pixels < 1 || max_image_mb < 1 || !(remote_media_timeout_s > 0)) {
    return invalid_argument(
        "--max-image-pixels, --max-image-mb and --remote-media-timeout-s must be positive");
  }
  options.max_image_pixels = max_image_pixels;
  // Without a vision tower (--role decode) the pixels would never be encoded: only mm_hash and
  // the grid are needed, and the resize is the costly part of preparing an image.
  options.needs_pixel_values = loaded.is_multimodal();
  options.fetch.allowed_local_media_path = allowed_local_media_path;
  options.fetch.allow_remote = allow_remote_media;
  options.fetch.max_image_bytes = max_image_mb << 20;
  options.fetch.remote_timeout_ms = static_cast<int>(remote_media_timeout_s * 1000);
  return server::MultimodalProcessor::create(processor, vision.spatial_merge_size,
                                             config.image_token_id, options);
}

}  // namespace crescent::apps
