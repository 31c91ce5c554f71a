#include "media/decode.h"

#include <cstring>
#include <string>

#include "media/decode_internal.h"

namespace crescent::media {
namespace internal {

Status check_image_size(int64_t width, int64_t height, const DecodeOptions& options) {
  if (width <= 0 || height <= 0) {
    return invalid_argument("image has an empty size " + std::to_string(width) + "x" +
                            std::to_string(height));
  }
  // Both sides come from 32-bit header fields, so the product fits in int64.
  int64_t pixels = width * height;
  if (pixels > options.max_pixels) {
    return invalid_argument("image of " + std::to_string(width) + "x" + std::to_string(height) +
                            " = " + std::to_string(pixels) + " pixels exceeds the limit of " +
                            std::to_string(options.max_pixels));
  }
  return Status::ok();
}

void composite_rgba_on_white(const uint8_t* rgba, int64_t num_pixels, uint8_t* rgb) {
  for (int64_t i = 0; i < num_pixels; ++i) {
    const uint8_t* in = rgba + i * 4;
    uint8_t* out = rgb + i * 3;
    out[0] = blend_over(255, in[0], in[3]);
    out[1] = blend_over(255, in[1], in[3]);
    out[2] = blend_over(255, in[2], in[3]);
  }
}

}  // namespace internal

namespace {

bool starts_with(std::span<const uint8_t> bytes, size_t offset, const char* magic, size_t n) {
  return bytes.size() >= offset + n && std::memcmp(bytes.data() + offset, magic, n) == 0;
}

}  // namespace

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  if (starts_with(bytes, 0, "\x89PNG\r\n\x1a\n", 8))
    return internal::decode_png(bytes, options);
  if (starts_with(bytes, 0, "\xff\xd8\xff", 3))
    return internal::decode_jpeg(bytes, options);
  if (starts_with(bytes, 0, "RIFF", 4) && starts_with(bytes, 8, "WEBP", 4))
    return internal::decode_webp(bytes, options);
  return invalid_argument("image data is not PNG, JPEG or WebP");
}

}  // namespace crescent::media
