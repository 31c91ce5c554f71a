#pragma once
// Shared by the per-format decoders (decode_png.cc, decode_jpeg.cc, decode_webp.cc); not part of
// the module's interface.

#include <cstdint>
#include <span>

#include "core/status.h"
#include "media/decode.h"
#include "media/image.h"

namespace crescent::media::internal {

// OK when width x height is non-empty and within options.max_pixels; called with the header's
// size before any pixel buffer is allocated.
Status check_image_size(int64_t width, int64_t height, const DecodeOptions& options);

// PIL's paste blend of one channel over a background: DIV255(bg * (255 - a) + c * a).
inline uint8_t blend_over(uint8_t background, uint8_t color, uint8_t alpha) {
  int v = background * (255 - alpha) + color * alpha + 128;
  return static_cast<uint8_t>(((v >> 8) + v) >> 8);
}

// RGBA (4 bytes per pixel) -> RGB over white, as vLLM's rgba_to_rgb:
// Image.new("RGB", size, (255, 255, 255)).paste(image, mask=alpha).
void composite_rgba_on_white(const uint8_t* rgba, int64_t num_pixels, uint8_t* rgb);

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const DecodeOptions& options);
Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const DecodeOptions& options);
Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const DecodeOptions& options);

}  // namespace crescent::media::internal
