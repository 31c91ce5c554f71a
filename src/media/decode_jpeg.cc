// JPEG through libjpeg(-turbo), as PIL drives it: default decompression settings (ISLOW IDCT,
// fancy upsampling), output L, RGB or CMYK by component count, CMYK treated as Adobe-inverted.
// libjpeg's error_exit must not return; ours longjmps back to the setjmp in read_header /
// read_pixels, and all state those touch lives in JpegState.

#include <cstdio>  // jpeglib.h needs FILE and size_t first
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "media/decode_internal.h"

namespace crescent::media::internal {
namespace {

const JOCTET kFakeEoi[2] = {0xFF, JPEG_EOI};

struct JpegState {
  jpeg_decompress_struct cinfo = {};
  jpeg_error_mgr error_mgr = {};
  jpeg_source_mgr source = {};
  std::jmp_buf jump;
  char error[JMSG_LENGTH_MAX] = {};
  std::span<const uint8_t> bytes;
  // Set once libjpeg asked for data past the end: PIL fails such a file ("image file is
  // truncated") unless every scanline was already out.
  bool hit_end = false;
  std::vector<uint8_t> pixels;  // height * width * output_components

  ~JpegState() { jpeg_destroy_decompress(&cinfo); }
};

JpegState* state_of(j_common_ptr cinfo) {
  return static_cast<JpegState*>(cinfo->client_data);
}

void on_error_exit(j_common_ptr cinfo) {
  JpegState* s = state_of(cinfo);
  (*cinfo->err->format_message)(cinfo, s->error);
  std::longjmp(s->jump, 1);
}

void on_output_message(j_common_ptr) {
  // Warnings ("Corrupt JPEG data: N extraneous bytes") are ignored, as PIL does.
}

void on_init_source(j_decompress_ptr) {}

boolean on_fill_input_buffer(j_decompress_ptr cinfo) {
  // Past the end: hand libjpeg an EOI so it finishes, and remember that the data was short.
  JpegState* s = state_of(reinterpret_cast<j_common_ptr>(cinfo));
  s->hit_end = true;
  cinfo->src->next_input_byte = kFakeEoi;
  cinfo->src->bytes_in_buffer = 2;
  return TRUE;
}

void on_skip_input_data(j_decompress_ptr cinfo, long num_bytes) {  // NOLINT(runtime/int)
  if (num_bytes <= 0)
    return;
  jpeg_source_mgr* src = cinfo->src;
  if (static_cast<size_t>(num_bytes) > src->bytes_in_buffer) {
    on_fill_input_buffer(cinfo);  // a marker segment runs past the end of the data
    return;
  }
  src->next_input_byte += num_bytes;
  src->bytes_in_buffer -= num_bytes;
}

void on_term_source(j_decompress_ptr) {}

bool read_header(JpegState* s) {
  if (setjmp(s->jump))
    return false;
  jpeg_create_decompress(&s->cinfo);
  s->source.init_source = on_init_source;
  s->source.fill_input_buffer = on_fill_input_buffer;
  s->source.skip_input_data = on_skip_input_data;
  s->source.resync_to_restart = jpeg_resync_to_restart;
  s->source.term_source = on_term_source;
  s->source.next_input_byte = s->bytes.data();
  s->source.bytes_in_buffer = s->bytes.size();
  s->cinfo.src = &s->source;
  if (jpeg_read_header(&s->cinfo, TRUE) != JPEG_HEADER_OK) {
    std::snprintf(s->error, sizeof(s->error), "no image in the data (tables only)");
    return false;
  }
  return true;
}

bool read_pixels(JpegState* s) {
  if (setjmp(s->jump))
    return false;
  jpeg_decompress_struct& cinfo = s->cinfo;
  // PIL picks its mode from the component count alone (1: L, 3: RGB, 4: CMYK) and asks libjpeg
  // for that colour space; libjpeg converts YCbCr -> RGB and YCCK -> CMYK itself.
  switch (cinfo.num_components) {
    case 1:
      cinfo.out_color_space = JCS_GRAYSCALE;
      break;
    case 3:
      cinfo.out_color_space = JCS_RGB;
      break;
    default:
      cinfo.out_color_space = JCS_CMYK;
      break;
  }
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
  s->pixels.resize(stride * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = s->pixels.data() + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (s->hit_end) {
    std::snprintf(s->error, sizeof(s->error), "truncated JPEG: the data ends inside the image");
    return false;
  }
  // No jpeg_finish_decompress: PIL does not require the EOI marker once the pixels are out.
  return true;
}

}  // namespace

Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  JpegState s;
  s.bytes = bytes;
  s.cinfo.err = jpeg_std_error(&s.error_mgr);
  s.cinfo.client_data = &s;  // jpeg_create_decompress keeps err and client_data
  s.error_mgr.error_exit = on_error_exit;
  s.error_mgr.output_message = on_output_message;
  if (!read_header(&s))
    return invalid_argument(std::string("corrupt JPEG: ") + s.error);
  const int components = s.cinfo.num_components;
  if (components != 1 && components != 3 && components != 4) {
    return invalid_argument("JPEG with " + std::to_string(components) +
                            " components is not supported (PIL reads 1, 3 or 4)");
  }
  RETURN_IF_ERROR(check_image_size(s.cinfo.image_width, s.cinfo.image_height, options));
  if (!read_pixels(&s)) {
    std::string message = s.error;
    if (message.rfind("truncated", 0) == 0)
      return invalid_argument(message);
    return invalid_argument("corrupt JPEG: " + message);
  }

  RgbImage image;
  image.width = static_cast<int32_t>(s.cinfo.output_width);
  image.height = static_cast<int32_t>(s.cinfo.output_height);
  const int64_t num_pixels = static_cast<int64_t>(image.width) * image.height;
  if (components == 3) {
    image.rgb = std::move(s.pixels);
    return image;
  }
  image.rgb.resize(num_pixels * 3);
  const uint8_t* in = s.pixels.data();
  uint8_t* out = image.rgb.data();
  if (components == 1) {
    for (int64_t i = 0; i < num_pixels; ++i)
      out[i * 3] = out[i * 3 + 1] = out[i * 3 + 2] = in[i];
    return image;
  }
  // PIL reads 4-component JPEGs as "CMYK;I" (every stored byte inverted, the Adobe convention)
  // and converts with cmyk2rgb: nk = 255 - k; c' = CLIP8(nk - MULDIV255(c, nk)). With the
  // inversion folded in, nk is the stored K and c is 255 - the stored C.
  for (int64_t i = 0; i < num_pixels; ++i) {
    const uint8_t* p = in + i * 4;
    const int nk = p[3];
    for (int c = 0; c < 3; ++c) {
      int t = (255 - p[c]) * nk + 128;
      int v = nk - (((t >> 8) + t) >> 8);
      out[i * 3 + c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
  return image;
}

}  // namespace crescent::media::internal
