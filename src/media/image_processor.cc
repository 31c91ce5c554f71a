#include "media/image_processor.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace crescent::media {
namespace {

Status check_config(const ImageProcessorConfig& c) {
  if (c.patch_size <= 0 || c.temporal_patch_size <= 0 || c.merge_size <= 0) {
    return invalid_argument("image processor: patch_size, temporal_patch_size and merge_size " +
                            std::string("must be positive"));
  }
  if (c.do_normalize) {
    for (float s : c.image_std) {
      if (s == 0.0f)
        return invalid_argument("image processor: image_std has a zero entry");
    }
  }
  return Status::ok();
}

// Python's round() on a float: nearest, ties to even (the default rounding mode of nearbyint).
int64_t python_round(double v) {
  return static_cast<int64_t>(std::nearbyint(v));
}

// Python's repr() of a float: the shortest digits that read back exactly, positional notation
// for exponents -4..15 (with ".0" on integers), scientific otherwise.
std::string python_float_repr(double v) {
  char text[64];
  int digits = 1;
  for (; digits < 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*e", digits - 1, v);
    if (std::strtod(text, nullptr) == v)
      break;
  }
  std::snprintf(text, sizeof(text), "%.*e", digits - 1, v);
  const int exponent = std::atoi(std::strchr(text, 'e') + 1);
  if (exponent < -4 || exponent >= 16)
    return text;
  std::snprintf(text, sizeof(text), "%.*f", std::max(digits - 1 - exponent, 0), v);
  std::string out = text;
  if (out.find('.') == std::string::npos)
    out += ".0";
  return out;
}

}  // namespace

Result<std::pair<int, int>> smart_resize(int height, int width, int factor, int64_t min_pixels,
                                         int64_t max_pixels) {
  if (height <= 0 || width <= 0) {
    return invalid_argument("smart_resize: image of " + std::to_string(width) + "x" +
                            std::to_string(height) + " has an empty side");
  }
  if (factor <= 0)
    return invalid_argument("smart_resize: factor must be positive");
  const double ratio =
      static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  if (ratio > 200) {
    return invalid_argument("absolute aspect ratio must be smaller than 200, got " +
                            python_float_repr(ratio));
  }
  const double h = height;
  const double w = width;
  int64_t h_bar = python_round(h / factor) * factor;
  int64_t w_bar = python_round(w / factor) * factor;
  if (h_bar * w_bar > max_pixels) {
    double beta = std::sqrt((h * w) / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / factor)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / factor)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0) {
    return invalid_argument("smart_resize: " + std::to_string(width) + "x" +
                            std::to_string(height) + " resizes to an empty image");
  }
  if (h_bar > std::numeric_limits<int>::max() || w_bar > std::numeric_limits<int>::max())
    return invalid_argument("smart_resize: the resized image is too large");
  return std::pair<int, int>(static_cast<int>(h_bar), static_cast<int>(w_bar));
}

Result<PatchGrid> patch_grid(int height, int width, const ImageProcessorConfig& config) {
  RETURN_IF_ERROR(check_config(config));
  if (width <= 0 || height <= 0) {
    return invalid_argument("preprocess_image: malformed image");
  }
  const int factor = config.patch_size * config.merge_size;
  if (config.do_resize) {
    ASSIGN_OR_RETURN(auto size,
                     smart_resize(height, width, factor, config.min_pixels, config.max_pixels));
    height = size.first;
    width = size.second;
  } else if (height % factor != 0 || width % factor != 0) {
    return invalid_argument("preprocess_image: without do_resize the image sides must be " +
                            std::string("multiples of ") + std::to_string(factor) + ", got " +
                            std::to_string(width) + "x" + std::to_string(height));
  }
  return PatchGrid{1, height / config.patch_size, width / config.patch_size};
}

Result<PixelPatches> preprocess_image(const RgbImage& image, const ImageProcessorConfig& config) {
  RETURN_IF_ERROR(check_config(config));
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return invalid_argument("preprocess_image: malformed image");
  }
  const int patch = config.patch_size;
  const int merge = config.merge_size;
  const int tp = config.temporal_patch_size;
  const int factor = patch * merge;

  RgbImage resized;
  const RgbImage* pixels = &image;
  if (config.do_resize) {
    ASSIGN_OR_RETURN(auto size, smart_resize(image.height, image.width, factor, config.min_pixels,
                                             config.max_pixels));
    resized = resize_bicubic(image, size.second, size.first);
    pixels = &resized;
  } else if (image.height % factor != 0 || image.width % factor != 0) {
    return invalid_argument("preprocess_image: without do_resize the image sides must be " +
                            std::string("multiples of ") + std::to_string(factor) + ", got " +
                            std::to_string(image.width) + "x" + std::to_string(image.height));
  }

  // Every output value depends only on (channel, byte), so the float pipeline runs once per
  // pair: rescale is float64 multiply then a cast to float32 (transformers' rescale), normalize
  // is (x - mean) / std with float32 operands (transformers' normalize, numpy float32 ops).
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = config.do_rescale
                    ? static_cast<float>(static_cast<double>(v) * config.rescale_factor)
                    : static_cast<float>(v);
      if (config.do_normalize)
        x = (x - config.image_mean[c]) / config.image_std[c];
      lut[c][v] = x;
    }
  }

  PixelPatches out;
  out.grid_t = 1;  // one image repeated to temporal_patch_size frames
  out.grid_h = pixels->height / patch;
  out.grid_w = pixels->width / patch;
  out.patch_dim = 3 * tp * patch * patch;
  out.values.resize(static_cast<size_t>(out.num_patches()) * out.patch_dim);
  // Rows in (t, h / m, w / m, m, m) order; columns in (c, tp, patch, patch) order.
  const int blocks_h = out.grid_h / merge;
  const int blocks_w = out.grid_w / merge;
  const int row_width = pixels->width * 3;
  float* dst = out.values.data();
  for (int bh = 0; bh < blocks_h; ++bh) {
    for (int bw = 0; bw < blocks_w; ++bw) {
      for (int mh = 0; mh < merge; ++mh) {
        for (int mw = 0; mw < merge; ++mw) {
          const int y0 = (bh * merge + mh) * patch;
          const int x0 = (bw * merge + mw) * patch;
          for (int c = 0; c < 3; ++c) {
            for (int t = 0; t < tp; ++t) {
              for (int py = 0; py < patch; ++py) {
                const uint8_t* src =
                    pixels->rgb.data() + static_cast<size_t>(y0 + py) * row_width + x0 * 3 + c;
                for (int px = 0; px < patch; ++px)
                  *dst++ = lut[c][src[px * 3]];
              }
            }
          }
        }
      }
    }
  }
  return out;
}

namespace {

template <typename T>
void hash_value(XXH3_state_t* state, T value) {
  XXH3_128bits_update(state, &value, sizeof(value));
}

}  // namespace

std::string image_hash(const RgbImage& image, const ImageProcessorConfig& config) {
  XXH3_state_t* state = XXH3_createState();
  CRESCENT_CHECK(state != nullptr) << "XXH3_createState";
  XXH3_128bits_reset(state);
  static constexpr char kDomain[] = "crescent.media.image.v1";
  XXH3_128bits_update(state, kDomain, sizeof(kDomain));
  hash_value<int32_t>(state, image.width);
  hash_value<int32_t>(state, image.height);
  hash_value<uint64_t>(state, image.rgb.size());
  XXH3_128bits_update(state, image.rgb.data(), image.rgb.size());
  hash_value<int32_t>(state, config.patch_size);
  hash_value<int32_t>(state, config.temporal_patch_size);
  hash_value<int32_t>(state, config.merge_size);
  hash_value<int64_t>(state, config.min_pixels);
  hash_value<int64_t>(state, config.max_pixels);
  for (float v : config.image_mean)
    hash_value<float>(state, v);
  for (float v : config.image_std)
    hash_value<float>(state, v);
  hash_value<double>(state, config.rescale_factor);
  hash_value<uint8_t>(state, config.do_resize ? 1 : 0);
  hash_value<uint8_t>(state, config.do_rescale ? 1 : 0);
  hash_value<uint8_t>(state, config.do_normalize ? 1 : 0);
  XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  char text[33];
  std::snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(hash.high64),
                static_cast<unsigned long long>(hash.low64));  // NOLINT(runtime/int)
  return text;
}

}  // namespace crescent::media
