#pragma once
// decode_image: PNG, JPEG or WebP bytes -> 8-bit RGB, the pixels vLLM's ImageMediaIO hands to
// the model processor (PIL's Image.open followed by vllm's convert_image_mode(image, "RGB")).
//
// - The format comes from the magic bytes; decoding is libpng, libjpeg(-turbo) and libwebp.
// - RGBA (PNG with alpha, 16-bit grey+alpha PNG, WebP with alpha) is composited over white with
//   PIL's integer blend, as vLLM's rgba_to_rgb does; every other mode is PIL's convert("RGB"):
//   grey replicated, grey+alpha drops alpha, palette and tRNS transparency ignored, 16-bit
//   channels reduced to their high byte (16-bit grey is clipped to 255, as PIL's I;16 -> RGB),
//   CMYK/YCCK JPEG read as Adobe-inverted CMYK and converted with PIL's cmyk2rgb. An animated
//   WebP gives its first frame (PIL's frame 0); APNG gives its default image.
// - GIF, BMP, TIFF and the other formats PIL also opens are refused.
// - EXIF orientation is NOT applied: vLLM's ImageMediaIO.load_bytes/load_file do not call
//   ImageOps.exif_transpose, so the model sees the stored pixel order.
// - width * height is checked against options.max_pixels from the header, before any pixel
//   buffer is allocated (decompression bombs).
// Every failure is InvalidArgument. Thread-safe: no shared state.

#include <cstdint>
#include <span>

#include "core/status.h"
#include "media/image.h"

namespace crescent::media {

struct DecodeOptions {
  int64_t max_pixels = 50'000'000;
};

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const DecodeOptions& options = {});

}  // namespace crescent::media
