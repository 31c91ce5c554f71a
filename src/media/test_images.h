#pragma once
// Test-only encoders: small images in each format with known pixels, written with the same
// libraries the decoders use.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crescent::media::testing {

// PNG of `color_type` (PNG_COLOR_TYPE_*) and `bit_depth`; `samples` holds the raw samples row by
// row (16-bit samples big-endian, sub-byte samples one per byte). `palette` (RGB triples) and
// `trns` are written when non-empty.
std::vector<uint8_t> encode_png(int width, int height, int color_type, int bit_depth,
                                const std::vector<uint8_t>& samples,
                                const std::vector<uint8_t>& palette = {},
                                const std::vector<uint8_t>& trns = {}, bool interlace = false);

// Baseline JPEG with 1 (grey), 3 (RGB in, YCbCr stored) or 4 (CMYK, stored as given with an
// Adobe marker) components. `ycck` stores 4-component input as YCCK instead.
std::vector<uint8_t> encode_jpeg(int width, int height, int components,
                                 const std::vector<uint8_t>& samples, int quality,
                                 bool ycck = false);

// Lossless WebP of RGBA pixels (alpha kept) or lossy WebP of RGB pixels.
std::vector<uint8_t> encode_webp_lossless_rgba(int width, int height,
                                               const std::vector<uint8_t>& rgba);
std::vector<uint8_t> encode_webp_lossy_rgb(int width, int height, const std::vector<uint8_t>& rgb,
                                           float quality);

// A deterministic pattern of `n` bytes.
std::vector<uint8_t> pattern(size_t n, uint32_t seed);

}  // namespace crescent::media::testing
