// PNG through libpng. libpng reports errors through a callback that must not return; ours
// longjmps back to the setjmp in read_header / read_pixels, and every piece of state those touch
// lives in PngState so nothing is left indeterminate by the jump.

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "media/decode_internal.h"

namespace crescent::media::internal {
namespace {

struct PngState {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
  char error[200] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_uint_32 width = 0;
  png_uint_32 height = 0;
  int bit_depth = 0;
  int color_type = 0;
  // Bytes of one row after the transforms read_pixels sets up.
  size_t row_bytes = 0;
  std::vector<uint8_t> pixels;  // height * row_bytes
  std::vector<png_bytep> rows;
  std::vector<uint8_t> palette;  // 256 * 3, read_pixels fills it for palette images

  ~PngState() {
    if (png != nullptr)
      png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->error, sizeof(state->error), "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {
  // PIL ignores what libpng only warns about (bad ancillary chunks, gamma oddities).
}

void on_png_read(png_structp png, png_bytep out, size_t length) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (length > state->bytes.size() - state->offset)
    png_error(png, "the data ends inside the image (truncated)");
  std::memcpy(out, state->bytes.data() + state->offset, length);
  state->offset += length;
}

bool read_header(PngState* s) {
  if (setjmp(png_jmpbuf(s->png)))
    return false;
  png_set_read_fn(s->png, s, on_png_read);
  // Our own max_pixels check replaces libpng's default 1e6-per-side limit.
  png_set_user_limits(s->png, 0x7fffffff, 0x7fffffff);
  png_read_info(s->png, s->info);
  int interlace = 0;
  png_get_IHDR(s->png, s->info, &s->width, &s->height, &s->bit_depth, &s->color_type, &interlace,
               nullptr, nullptr);
  return true;
}

bool read_pixels(PngState* s) {
  if (setjmp(png_jmpbuf(s->png)))
    return false;
  switch (s->color_type) {
    case PNG_COLOR_TYPE_PALETTE: {
      // Indices, one byte each; the palette is applied below so that indices past the PLTE
      // entries map as PIL maps them (its palette starts as a grey ramp).
      if (s->bit_depth < 8)
        png_set_packing(s->png);
      s->palette.resize(256 * 3);
      for (int i = 0; i < 256; ++i)
        s->palette[i * 3] = s->palette[i * 3 + 1] = s->palette[i * 3 + 2] = static_cast<uint8_t>(i);
      png_colorp entries = nullptr;
      int num_entries = 0;
      if (png_get_PLTE(s->png, s->info, &entries, &num_entries) == 0)
        png_error(s->png, "palette image without a PLTE chunk");
      for (int i = 0; i < num_entries && i < 256; ++i) {
        s->palette[i * 3] = entries[i].red;
        s->palette[i * 3 + 1] = entries[i].green;
        s->palette[i * 3 + 2] = entries[i].blue;
      }
      break;
    }
    case PNG_COLOR_TYPE_GRAY:
      // 1/2/4-bit grey scales to 0..255 by bit replication, as PIL's L;1/L;2/L;4 unpackers.
      // 16-bit grey stays 16-bit: PIL clips it (I;16 -> RGB), it does not take the high byte.
      if (s->bit_depth < 8)
        png_set_expand_gray_1_2_4_to_8(s->png);
      break;
    default:
      // RGB, grey+alpha and RGBA: PIL's ;16B unpackers keep the high byte, as png_set_strip_16.
      if (s->bit_depth == 16)
        png_set_strip_16(s->png);
      break;
  }
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  s->row_bytes = png_get_rowbytes(s->png, s->info);
  s->pixels.resize(s->row_bytes * s->height);
  s->rows.resize(s->height);
  for (png_uint_32 y = 0; y < s->height; ++y)
    s->rows[y] = s->pixels.data() + y * s->row_bytes;
  png_read_image(s->png, s->rows.data());
  // png_read_end is not called: PIL stops once it has the pixels, so a missing IEND or a bad
  // trailing chunk is no error.
  return true;
}

Status png_failure(const PngState& s) {
  return invalid_argument(std::string("corrupt PNG: ") + s.error);
}

// PIL's mode for the PNG, then convert("RGB") / the RGBA composite, from libpng's rows.
void to_rgb(const PngState& s, RgbImage* out) {
  const int64_t w = s.width;
  uint8_t* dst = out->rgb.data();
  for (png_uint_32 y = 0; y < s.height; ++y) {
    const uint8_t* row = s.rows[y];
    uint8_t* d = dst + static_cast<int64_t>(y) * w * 3;
    switch (s.color_type) {
      case PNG_COLOR_TYPE_PALETTE:
        for (int64_t x = 0; x < w; ++x)
          std::memcpy(d + x * 3, s.palette.data() + row[x] * 3, 3);
        break;
      case PNG_COLOR_TYPE_GRAY:
        for (int64_t x = 0; x < w; ++x) {
          uint8_t v = row[x];
          if (s.bit_depth == 16) {
            int wide = (row[x * 2] << 8) | row[x * 2 + 1];
            v = static_cast<uint8_t>(wide > 255 ? 255 : wide);
          }
          d[x * 3] = d[x * 3 + 1] = d[x * 3 + 2] = v;
        }
        break;
      case PNG_COLOR_TYPE_GRAY_ALPHA:
        for (int64_t x = 0; x < w; ++x) {
          uint8_t grey = row[x * 2];
          if (s.bit_depth == 16) {
            // PIL opens 16-bit grey+alpha as RGBA, so it is composited over white...
            uint8_t c = blend_over(255, grey, row[x * 2 + 1]);
            d[x * 3] = d[x * 3 + 1] = d[x * 3 + 2] = c;
          } else {
            // ...while 8-bit grey+alpha is LA, whose convert("RGB") drops the alpha.
            d[x * 3] = d[x * 3 + 1] = d[x * 3 + 2] = grey;
          }
        }
        break;
      case PNG_COLOR_TYPE_RGB:
        std::memcpy(d, row, w * 3);
        break;
      case PNG_COLOR_TYPE_RGB_ALPHA:
        composite_rgba_on_white(row, w, d);
        break;
    }
  }
}

}  // namespace

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  PngState s;
  s.bytes = bytes;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, on_png_error, on_png_warning);
  if (s.png == nullptr)
    return invalid_argument("corrupt PNG: libpng could not start");
  s.info = png_create_info_struct(s.png);
  if (s.info == nullptr)
    return invalid_argument("corrupt PNG: libpng could not start");
  if (!read_header(&s))
    return png_failure(s);
  RETURN_IF_ERROR(check_image_size(s.width, s.height, options));
  if (!read_pixels(&s))
    return png_failure(s);

  RgbImage image;
  image.width = static_cast<int32_t>(s.width);
  image.height = static_cast<int32_t>(s.height);
  image.rgb.resize(static_cast<size_t>(s.width) * s.height * 3);
  to_rgb(s, &image);
  return image;
}

}  // namespace crescent::media::internal
