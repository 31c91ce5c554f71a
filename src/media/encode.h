#pragma once
// encode_png / encode_jpeg: an RgbImage -> PNG (libpng) or baseline JPEG (libjpeg-turbo) bytes,
// for clients that send images (the `crescent bench serve` random-mm dataset) and for tests.
// decode_image reads both back: PNG exactly, JPEG within the codec's loss.
// Every failure (an empty image, a buffer that does not match the size, a library error) is
// InvalidArgument or Internal. Thread-safe: no shared state.

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "media/image.h"

namespace crescent::media {

struct PngEncodeOptions {
  // zlib level: 0 (stored) .. 9; -1 is zlib's default (6). Random pixels do not compress, so
  // a benchmark that sends noise loses nothing with 0 or 1 and encodes much faster.
  int compression_level = -1;
};

// 8-bit RGB, not interlaced; libpng's adaptive row filters.
Result<std::vector<uint8_t>> encode_png(const RgbImage& image,
                                        const PngEncodeOptions& options = {});

// Baseline JPEG, YCbCr 4:2:0 (libjpeg's defaults, as PIL's Image.save(format="JPEG")); quality
// 1..100 (PIL's default is 75).
Result<std::vector<uint8_t>> encode_jpeg(const RgbImage& image, int quality);

}  // namespace crescent::media
