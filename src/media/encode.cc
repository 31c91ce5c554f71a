// PNG through libpng, JPEG through libjpeg(-turbo). Both libraries report errors through a
// callback that must not return; ours longjmp back to the setjmp in write_png / write_jpeg, and
// everything those touch lives in a state struct owned by the caller, so nothing is left
// indeterminate by the jump and the destructors run in the caller.

#include "media/encode.h"

#include <png.h>

#include <cstdio>  // jpeglib.h needs FILE and size_t first
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <csetjmp>
#include <string>

namespace crescent::media {
namespace {

Status check_image(const RgbImage& image) {
  if (image.width <= 0 || image.height <= 0) {
    return invalid_argument("cannot encode an empty image (" + std::to_string(image.width) + "x" +
                            std::to_string(image.height) + ")");
  }
  const uint64_t expected = static_cast<uint64_t>(image.width) * image.height * 3;
  if (image.rgb.size() != expected) {
    return invalid_argument("RGB buffer of " + std::to_string(image.rgb.size()) + " bytes for a " +
                            std::to_string(image.width) + "x" + std::to_string(image.height) +
                            " image (expected " + std::to_string(expected) + ")");
  }
  return Status::ok();
}

// ---- PNG ----

struct PngWriteState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  char error[200] = {};
  std::vector<uint8_t> out;
  std::vector<png_bytep> rows;

  ~PngWriteState() {
    if (png != nullptr) {
      png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    }
  }
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngWriteState*>(png_get_error_ptr(png));
  std::snprintf(state->error, sizeof(state->error), "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void on_png_write(png_structp png, png_bytep data, size_t length) {
  auto* state = static_cast<PngWriteState*>(png_get_io_ptr(png));
  state->out.insert(state->out.end(), data, data + length);
}

void on_png_flush(png_structp) {}

bool write_png(PngWriteState* s, const RgbImage& image, const PngEncodeOptions& options) {
  if (setjmp(png_jmpbuf(s->png))) {
    return false;
  }
  png_set_write_fn(s->png, s, on_png_write, on_png_flush);
  if (options.compression_level >= 0) {
    png_set_compression_level(s->png, options.compression_level);
  }
  png_set_IHDR(s->png, s->info, static_cast<png_uint_32>(image.width),
               static_cast<png_uint_32>(image.height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(s->png, s->info);
  png_write_image(s->png, s->rows.data());
  png_write_end(s->png, nullptr);
  return true;
}

// ---- JPEG ----

// Output goes straight into a vector: jpeg_mem_dest's malloc'd buffer would leak on a longjmp.
struct JpegWriteState {
  jpeg_compress_struct cinfo = {};
  jpeg_error_mgr error_mgr = {};
  jpeg_destination_mgr dest = {};
  std::jmp_buf jump;
  char error[JMSG_LENGTH_MAX] = {};
  bool is_created = false;
  std::vector<uint8_t> out;

  ~JpegWriteState() {
    if (is_created) {
      jpeg_destroy_compress(&cinfo);
    }
  }
};

constexpr size_t kJpegChunkBytes = 64 << 10;

JpegWriteState* state_of(j_compress_ptr cinfo) {
  return static_cast<JpegWriteState*>(cinfo->client_data);
}

void on_jpeg_error_exit(j_common_ptr cinfo) {
  auto* s = static_cast<JpegWriteState*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, s->error);
  std::longjmp(s->jump, 1);
}

void on_jpeg_output_message(j_common_ptr) {}

void on_init_destination(j_compress_ptr cinfo) {
  JpegWriteState* s = state_of(cinfo);
  s->out.resize(kJpegChunkBytes);
  cinfo->dest->next_output_byte = s->out.data();
  cinfo->dest->free_in_buffer = s->out.size();
}

boolean on_empty_output_buffer(j_compress_ptr cinfo) {
  // libjpeg calls this only with the whole buffer full (free_in_buffer is stale).
  JpegWriteState* s = state_of(cinfo);
  const size_t used = s->out.size();
  s->out.resize(used * 2);
  cinfo->dest->next_output_byte = s->out.data() + used;
  cinfo->dest->free_in_buffer = s->out.size() - used;
  return TRUE;
}

void on_term_destination(j_compress_ptr cinfo) {
  JpegWriteState* s = state_of(cinfo);
  s->out.resize(s->out.size() - cinfo->dest->free_in_buffer);
}

bool write_jpeg(JpegWriteState* s, const RgbImage& image, int quality) {
  if (setjmp(s->jump)) {
    return false;
  }
  jpeg_create_compress(&s->cinfo);
  s->is_created = true;
  s->dest.init_destination = on_init_destination;
  s->dest.empty_output_buffer = on_empty_output_buffer;
  s->dest.term_destination = on_term_destination;
  s->cinfo.dest = &s->dest;
  s->cinfo.image_width = static_cast<JDIMENSION>(image.width);
  s->cinfo.image_height = static_cast<JDIMENSION>(image.height);
  s->cinfo.input_components = 3;
  s->cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&s->cinfo);
  jpeg_set_quality(&s->cinfo, quality, TRUE);
  jpeg_start_compress(&s->cinfo, TRUE);
  const size_t stride = static_cast<size_t>(image.width) * 3;
  while (s->cinfo.next_scanline < s->cinfo.image_height) {
    // libjpeg's API takes non-const rows; it only reads them.
    auto* row = const_cast<JSAMPLE*>(image.rgb.data() + stride * s->cinfo.next_scanline);
    jpeg_write_scanlines(&s->cinfo, &row, 1);
  }
  jpeg_finish_compress(&s->cinfo);
  return true;
}

}  // namespace

Result<std::vector<uint8_t>> encode_png(const RgbImage& image, const PngEncodeOptions& options) {
  RETURN_IF_ERROR(check_image(image));
  if (options.compression_level < -1 || options.compression_level > 9) {
    return invalid_argument("PNG compression level must be -1..9, got " +
                            std::to_string(options.compression_level));
  }
  PngWriteState s;
  s.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &s, on_png_error, on_png_warning);
  if (s.png == nullptr) {
    return internal_error("libpng could not start a PNG writer");
  }
  s.info = png_create_info_struct(s.png);
  if (s.info == nullptr) {
    return internal_error("libpng could not start a PNG writer");
  }
  const size_t stride = static_cast<size_t>(image.width) * 3;
  s.rows.resize(static_cast<size_t>(image.height));
  for (size_t y = 0; y < s.rows.size(); ++y) {
    // libpng's API takes non-const rows; it only reads them.
    s.rows[y] = const_cast<png_bytep>(image.rgb.data() + y * stride);
  }
  // Raw size plus zlib's worst case for incompressible data (5 bytes per 16 KiB block), the
  // filter byte of each row and the chunk headers.
  s.out.reserve(image.rgb.size() + s.rows.size() + image.rgb.size() / 16384 * 5 + 1024);
  if (!write_png(&s, image, options)) {
    return internal_error(std::string("PNG encoding failed: ") + s.error);
  }
  return std::move(s.out);
}

Result<std::vector<uint8_t>> encode_jpeg(const RgbImage& image, int quality) {
  RETURN_IF_ERROR(check_image(image));
  if (quality < 1 || quality > 100) {
    return invalid_argument("JPEG quality must be 1..100, got " + std::to_string(quality));
  }
  // Baseline JPEG stores each side in 16 bits.
  if (image.width > 65500 || image.height > 65500) {
    return invalid_argument("JPEG sides are at most 65500 pixels, got " +
                            std::to_string(image.width) + "x" + std::to_string(image.height));
  }
  JpegWriteState s;
  s.cinfo.err = jpeg_std_error(&s.error_mgr);
  s.cinfo.client_data = &s;  // jpeg_create_compress keeps err and client_data
  s.error_mgr.error_exit = on_jpeg_error_exit;
  s.error_mgr.output_message = on_jpeg_output_message;
  if (!write_jpeg(&s, image, quality)) {
    return internal_error(std::string("JPEG encoding failed: ") + s.error);
  }
  return std::move(s.out);
}

}  // namespace crescent::media
