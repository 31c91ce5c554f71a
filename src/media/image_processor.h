#pragma once
// Qwen2-VL / Qwen2.5-VL image preprocessing, bit-compatible with transformers'
// Qwen2VLImageProcessor (the slow, PIL-based one): smart_resize, Pillow's BICUBIC resize,
// rescale and normalize in float32 as numpy does it, then the patch flattening the vision tower
// reads. Pure functions; thread-safe.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "media/image.h"

namespace crescent::media {

struct ImageProcessorConfig {
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  double rescale_factor = 1.0 / 255;
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
};

// Reads a Hugging Face preprocessor_config.json of Qwen2-VL or Qwen2.5-VL. Every field is
// optional with Qwen2VLImageProcessor's default; "size": {"shortest_edge", "longest_edge"} (newer
// transformers) is read first and top-level "min_pixels"/"max_pixels" override it, as the
// processor's constructor does. "resample", if present, must be 3 (BICUBIC). A malformed
// document or a field of the wrong type or range is InvalidArgument naming the field.
Result<ImageProcessorConfig> parse_preprocessor_config(std::string_view json);

// The preprocessor_config.json make-model writes and transformers reads back into the same
// config; `processor_class` is the image processor class, written as "image_processor_type"
// (e.g. "Qwen2VLImageProcessor").
std::string to_preprocessor_config_json(const ImageProcessorConfig& config,
                                        std::string_view processor_class);

// transformers' smart_resize (image_processing_qwen2_vl.py): {height, width}, both multiples of
// `factor`, area within [min_pixels, max_pixels] where possible, aspect ratio kept. Python's
// round-half-to-even and float64 arithmetic are reproduced. InvalidArgument where the reference
// raises (aspect ratio above 200, a zero side) or the result is empty or overflows int.
Result<std::pair<int, int>> smart_resize(int height, int width, int factor, int64_t min_pixels,
                                         int64_t max_pixels);

// Pillow's Image.resize((width, height), Image.BICUBIC) on an RGB image, bit-exact: separable
// fixed-point resampling, horizontal pass first, a pass skipped when its size is unchanged.
// width and height must be positive (checked).
RgbImage resize_bicubic(const RgbImage& image, int width, int height);

// The model input for one still image.
struct PixelPatches {
  int grid_t = 0;
  int grid_h = 0;
  int grid_w = 0;
  int patch_dim = 0;          // 3 * temporal_patch_size * patch_size * patch_size
  std::vector<float> values;  // [grid_t * grid_h * grid_w][patch_dim], Qwen2VLImageProcessor's
                              // flatten order
  int num_patches() const { return grid_t * grid_h * grid_w; }
  // Tokens the language model sees after the vision tower's spatial merge.
  int num_merged_tokens(int merge_size) const { return num_patches() / (merge_size * merge_size); }
};

// The patch grid preprocess_image() would give an image of this size, without touching a
// pixel: {grid_t, grid_h, grid_w} in ViT patches. The same errors as preprocess_image().
struct PatchGrid {
  int grid_t = 1;
  int grid_h = 0;
  int grid_w = 0;
};
Result<PatchGrid> patch_grid(int height, int width, const ImageProcessorConfig& config);

// Qwen2VLImageProcessor._preprocess for one image: smart_resize + resize_bicubic (when
// do_resize), rescale (float64 multiply, then float32), normalize ((x - mean) / std in float32),
// the image repeated to temporal_patch_size frames, then reshape to (grid_t, tp, C, gh/m, m, p,
// gw/m, m, p), transpose (0,3,6,4,7,2,1,5,8) and flatten. InvalidArgument for a bad config, an
// image smart_resize refuses, or (without do_resize) sides that are not multiples of
// patch_size * merge_size.
Result<PixelPatches> preprocess_image(const RgbImage& image, const ImageProcessorConfig& config);

// 32 lowercase hex chars: XXH3-128 over the size, the RGB bytes and every config field. Equal
// pixels with equal preprocessing hash equal; a change to either changes the hash.
std::string image_hash(const RgbImage& image, const ImageProcessorConfig& config);

}  // namespace crescent::media
