#pragma once
// MultimodalProcessor: the server's half of an image request. It turns the image_url parts of
// a chat request into what the engine takes: fetch the bytes (image_inputs.h), decode them to
// RGB and preprocess them exactly as the model's image processor does (src/media), hash the
// result (mm_hash), and expand each image placeholder the chat template rendered into one token
// per merged patch, recording where each image's run sits. Runs on the HTTP threads, so the
// engine's thread never decodes an image. Immutable after creation; thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/multimodal.h"
#include "media/image_processor.h"
#include "server/image_inputs.h"
#include "server/openai_protocol.h"

namespace crescent::server {

struct MultimodalOptions {
  ImageFetchOptions fetch;
  int max_images_per_prompt = 8;          // vLLM's --limit-mm-per-prompt (image)
  int64_t max_image_pixels = 50'000'000;  // decoded size, before resizing
  // false: a server that never encodes (--role decode) gets each image's mm_hash and grid
  // without the resize and patch flattening it would never use (input stays null).
  bool needs_pixel_values = true;
};

struct PreparedImage {
  std::shared_ptr<const engine::EncoderInput> input;
  // Set when the embeddings were pulled from an encoder worker (EPD): the engine then does not
  // encode the image; input is dropped.
  std::shared_ptr<const std::vector<float>> embeddings;
  // Decoded, with its pixel values deferred (prepare(..., kDeferred)): make_pixel_values()
  // makes them if no pulled embeddings arrive.
  std::shared_ptr<const media::RgbImage> deferred_rgb;
  std::string mm_hash;
  int llm_grid_t = 0;
  int llm_grid_h = 0;
  int llm_grid_w = 0;
  int num_tokens() const { return llm_grid_t * llm_grid_h * llm_grid_w; }
};

class MultimodalProcessor {
 public:
  // processor: the model's image processor settings; merge_size must equal the vision tower's
  // spatial_merge_size. image_token_id: the placeholder (<|image_pad|>).
  static Result<std::shared_ptr<const MultimodalProcessor>> create(
      media::ImageProcessorConfig processor, int spatial_merge_size, int32_t image_token_id,
      MultimodalOptions options);

  const MultimodalOptions& options() const { return options_; }
  const media::ImageProcessorConfig& processor() const { return processor_; }
  int32_t image_token_id() const { return image_token_id_; }

  // kDeferred: the caller expects each image's embeddings from an encoder worker (EPD), so the
  // resize and patch flattening wait for make_pixel_values(); the image is still fetched,
  // decoded and hashed here (its mm_hash is what matches it to the encoder's output) and its
  // grid checked.
  enum class PixelValues { kNow, kDeferred };
  // Fetches, decodes and preprocesses every image. InvalidArgument (DeadlineExceeded for a
  // remote fetch past its time) naming the image by its position in the request.
  Result<std::vector<PreparedImage>> prepare(const std::vector<ImageRef>& images,
                                             PixelValues when = PixelValues::kNow) const;
  // The pixel values of every image that kDeferred left without them and that has no
  // embeddings now (the pull failed or had no item for it); drops the decoded images.
  Status make_pixel_values(std::vector<PreparedImage>& images) const;
  // A server that needs no pixel values (--role decode): the images' mm_hash and grid taken
  // from ec_transfer_params, one item per image in order ({"mm_hash", "grid": [t, h, w]} with
  // t * h * w = shape[0]), as the proxy sends them, so no image is fetched or decoded.
  // nullopt when this server needs pixels or the items do not fit exactly (the caller then
  // prepares the images itself).
  std::optional<std::vector<PreparedImage>> prepared_from_ec_params(
      const nlohmann::json& ec_transfer_params, size_t num_images) const;
  // The same for a prefill server whose request names its images only by ec:// references
  // (no pixels): the items are all it has, whatever it could encode.
  std::optional<std::vector<PreparedImage>> described_by_ec_params(
      const nlohmann::json& ec_transfer_params, size_t num_images) const;
  // prompt holds exactly one image_token_id per image (in order), as the chat template renders
  // it: each becomes the image's num_tokens() placeholders. Returns the engine's items.
  Result<std::vector<engine::MultiModalItem>> expand(
      std::vector<int32_t>& prompt, const std::vector<PreparedImage>& images) const;

 private:
  MultimodalProcessor(media::ImageProcessorConfig processor, int32_t image_token_id,
                      MultimodalOptions options)
      : processor_(processor), image_token_id_(image_token_id), options_(std::move(options)) {}
  Result<PreparedImage> prepare_one(const ImageRef& image, PixelValues when) const;
  Status fill_pixel_values(const media::RgbImage& rgb, PreparedImage* out) const;

  media::ImageProcessorConfig processor_;
  int32_t image_token_id_;
  MultimodalOptions options_;
};

}  // namespace crescent::server
