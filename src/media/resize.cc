// Pillow's ImagingResample (src/libImaging/Resample.c) for 8-bit RGB with the BICUBIC filter,
// reproduced operation for operation so the output is byte-identical: double-precision filter
// weights normalised per output pixel, converted to fixed point with PRECISION_BITS, int32
// accumulation starting at one half, clipping to uint8 after each pass.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "media/image_processor.h"

namespace crescent::media {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kBicubicSupport = 2.0;

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0)
    x = -x;
  if (x < 1.0)
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0)
    return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

uint8_t clip8(int v) {
  // Pillow's clip8_lookups[v >> PRECISION_BITS], whose table saturates below 0 and above 255.
  return static_cast<uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// precompute_coeffs + normalize_coeffs_8bpc for a full-image box (in0 = 0, in1 = in_size).
struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;  // per output: first input index, count
  std::vector<int32_t> kk;  // per output: ksize fixed-point weights
};

Coefficients precompute_coeffs(int in_size, int out_size) {
  const float in0 = 0.0f;
  const float in1 = static_cast<float>(in_size);
  double scale = static_cast<double>(in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = kBicubicSupport * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.kk.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0)
      xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size)
      xmax = in_size;
    xmax -= xmin;
    int x = 0;
    for (; x < xmax; ++x) {
      double w = bicubic_filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; ++x) {
      if (ww != 0.0)
        k[x] /= ww;
    }
    for (; x < c.ksize; ++x)
      k[x] = 0;
    int32_t* out = c.kk.data() + static_cast<size_t>(xx) * c.ksize;
    for (x = 0; x < c.ksize; ++x) {
      out[x] = k[x] < 0 ? static_cast<int>(-0.5 + k[x] * (1 << kPrecisionBits))
                        : static_cast<int>(0.5 + k[x] * (1 << kPrecisionBits));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

// ImagingResampleHorizontal_8bpc, 3 bands: output rows 0..out_rows-1 from input rows offset...
void resample_horizontal(const RgbImage& in, int offset, int out_rows, const Coefficients& c,
                         RgbImage* out) {
  const int out_w = out->width;
  for (int yy = 0; yy < out_rows; ++yy) {
    const uint8_t* row = in.rgb.data() + static_cast<size_t>(yy + offset) * in.width * 3;
    uint8_t* dst = out->rgb.data() + static_cast<size_t>(yy) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[xx * 2];
      const int xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = c.kk.data() + static_cast<size_t>(xx) * c.ksize;
      int ss0 = 1 << (kPrecisionBits - 1);
      int ss1 = ss0;
      int ss2 = ss0;
      for (int x = 0; x < xmax; ++x) {
        const uint8_t* p = row + (x + xmin) * 3;
        ss0 += p[0] * k[x];
        ss1 += p[1] * k[x];
        ss2 += p[2] * k[x];
      }
      dst[xx * 3] = clip8(ss0);
      dst[xx * 3 + 1] = clip8(ss1);
      dst[xx * 3 + 2] = clip8(ss2);
    }
  }
}

// ImagingResampleVertical_8bpc, 3 bands; `row_shift` is subtracted from the bounds (Pillow
// shifts them when the horizontal pass produced only the rows the vertical pass reads).
void resample_vertical(const RgbImage& in, int row_shift, const Coefficients& c, RgbImage* out) {
  const int w = out->width;
  for (int yy = 0; yy < out->height; ++yy) {
    const int ymin = c.bounds[yy * 2] - row_shift;
    const int ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = c.kk.data() + static_cast<size_t>(yy) * c.ksize;
    uint8_t* dst = out->rgb.data() + static_cast<size_t>(yy) * w * 3;
    for (int xx = 0; xx < w * 3; xx += 3) {
      int ss0 = 1 << (kPrecisionBits - 1);
      int ss1 = ss0;
      int ss2 = ss0;
      for (int y = 0; y < ymax; ++y) {
        const uint8_t* p = in.rgb.data() + static_cast<size_t>(y + ymin) * w * 3 + xx;
        ss0 += p[0] * k[y];
        ss1 += p[1] * k[y];
        ss2 += p[2] * k[y];
      }
      dst[xx] = clip8(ss0);
      dst[xx + 1] = clip8(ss1);
      dst[xx + 2] = clip8(ss2);
    }
  }
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& image, int width, int height) {
  CRESCENT_CHECK(width > 0 && height > 0) << "resize_bicubic to " << width << "x" << height;
  CRESCENT_CHECK_EQ(image.rgb.size(), static_cast<size_t>(image.width) * image.height * 3);
  const bool need_horizontal = width != image.width;
  const bool need_vertical = height != image.height;
  if (!need_horizontal && !need_vertical)
    return image;  // Image.resize returns a copy when the size is unchanged

  Coefficients vert = precompute_coeffs(image.height, height);
  // Rows of the source the vertical pass reads; the horizontal pass computes only those.
  const int ybox_first = vert.bounds[0];
  const int ybox_last = vert.bounds[height * 2 - 2] + vert.bounds[height * 2 - 1];

  RgbImage horizontal;
  const RgbImage* source = &image;
  int row_shift = 0;
  if (need_horizontal) {
    Coefficients horiz = precompute_coeffs(image.width, width);
    horizontal.width = width;
    horizontal.height = ybox_last - ybox_first;
    horizontal.rgb.resize(static_cast<size_t>(horizontal.width) * horizontal.height * 3);
    resample_horizontal(image, ybox_first, horizontal.height, horiz, &horizontal);
    row_shift = ybox_first;
    source = &horizontal;
  }
  if (!need_vertical) {
    // The horizontal pass covered every row: without a vertical pass the bounds span the image.
    return horizontal;
  }
  RgbImage out;
  out.width = source->width;
  out.height = height;
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  resample_vertical(*source, row_shift, vert, &out);
  return out;
}

}  // namespace crescent::media
