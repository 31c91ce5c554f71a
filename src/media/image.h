#pragma once
// RgbImage: a decoded still image, 8-bit RGB, the form every media path hands to preprocessing.

#include <cstdint>
#include <vector>

namespace crescent::media {

struct RgbImage {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel, width * height * 3 bytes
};

}  // namespace crescent::media
