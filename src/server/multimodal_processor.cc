#include "server/multimodal_processor.h"

#include "media/decode.h"

namespace crescent::server {

Result<std::shared_ptr<const MultimodalProcessor>> MultimodalProcessor::create(
    media::ImageProcessorConfig processor, int spatial_merge_size, int32_t image_token_id,
    MultimodalOptions options) {
  if (processor.merge_size != spatial_merge_size) {
    return invalid_argument("preprocessor_config.json merge_size " +
                            std::to_string(processor.merge_size) +
                            " differs from the vision tower's spatial_merge_size " +
                            std::to_string(spatial_merge_size));
  }
  if (image_token_id < 0) {
    return invalid_argument("the model names no image placeholder token (image_token_id)");
  }
  if (options.max_images_per_prompt < 0 || options.max_image_pixels < 1) {
    return invalid_argument("image limits must be positive");
  }
  RETURN_IF_ERROR(validate_image_fetch_options(options.fetch));
  return std::shared_ptr<const MultimodalProcessor>(
      new MultimodalProcessor(processor, image_token_id, std::move(options)));
}

Result<PreparedImage> MultimodalProcessor::prepare_one(const ImageRef& image,
                                                       PixelValues when) const {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, fetch_image_bytes(image.url, options_.fetch));
  media::DecodeOptions decode_options;
  decode_options.max_pixels = options_.max_image_pixels;
  ASSIGN_OR_RETURN(media::RgbImage rgb, media::decode_image(bytes, decode_options));
  const int merge = processor_.merge_size;
  PreparedImage out;
  out.mm_hash = media::image_hash(rgb, processor_);
  if (!options_.needs_pixel_values || when == PixelValues::kDeferred) {
    ASSIGN_OR_RETURN(media::PatchGrid grid, media::patch_grid(rgb.height, rgb.width, processor_));
    out.llm_grid_t = grid.grid_t;
    out.llm_grid_h = grid.grid_h / merge;
    out.llm_grid_w = grid.grid_w / merge;
    if (options_.needs_pixel_values) {
      out.deferred_rgb = std::make_shared<const media::RgbImage>(std::move(rgb));
    }
    return out;
  }
  RETURN_IF_ERROR(fill_pixel_values(rgb, &out));
  return out;
}

Status MultimodalProcessor::fill_pixel_values(const media::RgbImage& rgb,
                                              PreparedImage* out) const {
  const int merge = processor_.merge_size;
  ASSIGN_OR_RETURN(media::PixelPatches patches, media::preprocess_image(rgb, processor_));
  out->llm_grid_t = patches.grid_t;
  out->llm_grid_h = patches.grid_h / merge;
  out->llm_grid_w = patches.grid_w / merge;
  auto input = std::make_shared<engine::EncoderInput>();
  input->grid_t = patches.grid_t;
  input->grid_h = patches.grid_h;
  input->grid_w = patches.grid_w;
  input->pixel_values = std::move(patches.values);
  out->input = std::move(input);
  return Status::ok();
}

Status MultimodalProcessor::make_pixel_values(std::vector<PreparedImage>& images) const {
  for (size_t i = 0; i < images.size(); ++i) {
    PreparedImage& image = images[i];
    std::shared_ptr<const media::RgbImage> rgb = std::move(image.deferred_rgb);
    image.deferred_rgb = nullptr;
    if (rgb == nullptr || image.embeddings != nullptr || image.input != nullptr) {
      continue;
    }
    Status made = fill_pixel_values(*rgb, &image);
    if (!made.is_ok()) {
      return Status(made.code(), "image " + std::to_string(i + 1) + " of " +
                                     std::to_string(images.size()) + ": " + made.message());
    }
  }
  return Status::ok();
}

Result<std::vector<PreparedImage>> MultimodalProcessor::prepare(const std::vector<ImageRef>& images,
                                                                PixelValues when) const {
  if (static_cast<int>(images.size()) > options_.max_images_per_prompt) {
    return invalid_argument("the request has " + std::to_string(images.size()) +
                            " images, more than this server's limit of " +
                            std::to_string(options_.max_images_per_prompt) +
                            " per prompt (--limit-mm-per-prompt)");
  }
  std::vector<PreparedImage> out;
  out.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    Result<PreparedImage> one = prepare_one(images[i], when);
    if (!one.is_ok()) {
      return Status(one.status().code(), "image " + std::to_string(i + 1) + " of " +
                                             std::to_string(images.size()) + ": " +
                                             one.status().message());
    }
    out.push_back(std::move(*one));
  }
  return out;
}

std::optional<std::vector<PreparedImage>> MultimodalProcessor::prepared_from_ec_params(
    const nlohmann::json& ec_transfer_params, size_t num_images) const {
  if (options_.needs_pixel_values) {
    return std::nullopt;
  }
  return described_by_ec_params(ec_transfer_params, num_images);
}

std::optional<std::vector<PreparedImage>> MultimodalProcessor::described_by_ec_params(
    const nlohmann::json& ec_transfer_params, size_t num_images) const {
  if (!ec_transfer_params.is_object()) {
    return std::nullopt;
  }
  auto items = ec_transfer_params.find("items");
  if (items == ec_transfer_params.end() || !items->is_array() || items->size() != num_images ||
      static_cast<int>(num_images) > options_.max_images_per_prompt) {
    return std::nullopt;
  }
  std::vector<PreparedImage> out;
  out.reserve(num_images);
  for (const nlohmann::json& item : *items) {
    if (!item.is_object()) {
      return std::nullopt;
    }
    auto hash = item.find("mm_hash");
    auto grid = item.find("grid");
    auto shape = item.find("shape");
    if (hash == item.end() || !hash->is_string() || hash->get_ref<const std::string&>().empty() ||
        grid == item.end() || !grid->is_array() || grid->size() != 3 || shape == item.end() ||
        !shape->is_array() || shape->empty() || !(*shape)[0].is_number_integer()) {
      return std::nullopt;
    }
    PreparedImage image;
    image.mm_hash = hash->get<std::string>();
    int* dims[3] = {&image.llm_grid_t, &image.llm_grid_h, &image.llm_grid_w};
    for (size_t d = 0; d < 3; ++d) {
      const nlohmann::json& v = (*grid)[d];
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1 << 16) {
        return std::nullopt;
      }
      *dims[d] = v.get<int>();
    }
    if (int64_t{image.llm_grid_t} * image.llm_grid_h * image.llm_grid_w !=
        (*shape)[0].get<int64_t>()) {
      return std::nullopt;
    }
    out.push_back(std::move(image));
  }
  return out;
}

Result<std::vector<engine::MultiModalItem>> MultimodalProcessor::expand(
    std::vector<int32_t>& prompt, const std::vector<PreparedImage>& images) const {
  size_t num_placeholders = 0;
  for (int32_t id : prompt) {
    num_placeholders += id == image_token_id_ ? 1 : 0;
  }
  if (num_placeholders != images.size()) {
    return invalid_argument("the prompt holds " + std::to_string(num_placeholders) +
                            " image placeholder tokens but the request has " +
                            std::to_string(images.size()) + " images");
  }
  std::vector<engine::MultiModalItem> items;
  if (images.empty()) {
    return items;
  }
  std::vector<int32_t> expanded;
  size_t total = prompt.size();
  for (const PreparedImage& image : images) {
    total += static_cast<size_t>(image.num_tokens()) - 1;
  }
  expanded.reserve(total);
  size_t next = 0;
  for (int32_t id : prompt) {
    if (id != image_token_id_) {
      expanded.push_back(id);
      continue;
    }
    const PreparedImage& image = images[next++];
    engine::MultiModalItem item;
    item.mm_hash = image.mm_hash;
    item.offset = static_cast<int>(expanded.size());
    item.num_tokens = image.num_tokens();
    item.llm_grid_t = image.llm_grid_t;
    item.llm_grid_h = image.llm_grid_h;
    item.llm_grid_w = image.llm_grid_w;
    item.input = image.input;
    item.embeddings = image.embeddings;
    expanded.insert(expanded.end(), static_cast<size_t>(item.num_tokens), image_token_id_);
    items.push_back(std::move(item));
  }
  prompt = std::move(expanded);
  return items;
}

}  // namespace crescent::server
