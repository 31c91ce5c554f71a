#include "media/test_images.h"

#include <png.h>
#include <webp/encode.h>

#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <cstdlib>
#include <cstring>

namespace crescent::media::testing {
namespace {

void on_png_write(png_structp png, png_bytep data, size_t length) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + length);
}

void on_png_flush(png_structp) {}

}  // namespace

std::vector<uint8_t> encode_png(int width, int height, int color_type, int bit_depth,
                                const std::vector<uint8_t>& samples,
                                const std::vector<uint8_t>& palette,
                                const std::vector<uint8_t>& trns, bool interlace) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png)))
    std::abort();
  png_set_write_fn(png, &out, on_png_write, on_png_flush);
  png_set_IHDR(png, info, width, height, bit_depth, color_type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> entries;
  for (size_t i = 0; i + 2 < palette.size(); i += 3)
    entries.push_back({palette[i], palette[i + 1], palette[i + 2]});
  if (!entries.empty())
    png_set_PLTE(png, info, entries.data(), static_cast<int>(entries.size()));
  if (!trns.empty()) {
    if (color_type == PNG_COLOR_TYPE_PALETTE) {
      png_set_tRNS(png, info, trns.data(), static_cast<int>(trns.size()), nullptr);
    } else {
      png_color_16 colour = {};
      colour.gray = colour.red = trns[0];
      colour.green = trns.size() > 1 ? trns[1] : 0;
      colour.blue = trns.size() > 2 ? trns[2] : 0;
      png_set_tRNS(png, info, nullptr, 0, &colour);
    }
  }
  png_write_info(png, info);
  if (bit_depth < 8)
    png_set_packing(png);
  int channels = 1;
  if (color_type == PNG_COLOR_TYPE_RGB)
    channels = 3;
  if (color_type == PNG_COLOR_TYPE_GRAY_ALPHA)
    channels = 2;
  if (color_type == PNG_COLOR_TYPE_RGB_ALPHA)
    channels = 4;
  const size_t row_bytes = static_cast<size_t>(width) * channels * (bit_depth == 16 ? 2 : 1);
  std::vector<png_bytep> rows(height);
  for (int y = 0; y < height; ++y)
    rows[y] = const_cast<png_bytep>(samples.data() + y * row_bytes);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::vector<uint8_t> encode_jpeg(int width, int height, int components,
                                 const std::vector<uint8_t>& samples, int quality, bool ycck) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int)
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  if (components == 4)
    jpeg_set_colorspace(&cinfo, ycck ? JCS_YCCK : JCS_CMYK);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(width) * components;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples.data() + stride * cinfo.next_scanline);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

std::vector<uint8_t> encode_webp_lossless_rgba(int width, int height,
                                               const std::vector<uint8_t>& rgba) {
  uint8_t* data = nullptr;
  size_t size = WebPEncodeLosslessRGBA(rgba.data(), width, height, width * 4, &data);
  std::vector<uint8_t> out(data, data + size);
  WebPFree(data);
  return out;
}

std::vector<uint8_t> encode_webp_lossy_rgb(int width, int height, const std::vector<uint8_t>& rgb,
                                           float quality) {
  uint8_t* data = nullptr;
  size_t size = WebPEncodeRGB(rgb.data(), width, height, width * 3, quality, &data);
  std::vector<uint8_t> out(data, data + size);
  WebPFree(data);
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

}  // namespace crescent::media::testing
