// WebP through libwebp's animation decoder, the path PIL takes for every WebP file (still ones
// included): the first frame on a canvas that starts transparent black, in non-premultiplied
// RGBA. PIL calls the image RGBA when the bitstream says it has alpha (composited over white by
// vLLM) and RGB otherwise (the alpha byte dropped).

#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>
#include <memory>
#include <string>

#include "media/decode_internal.h"

namespace crescent::media::internal {
namespace {

std::string vp8_status_name(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "user abort";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated)";
  }
  return "status " + std::to_string(static_cast<int>(status));
}

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* decoder) const { WebPAnimDecoderDelete(decoder); }
};

}  // namespace

Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  // decode_image saw "RIFF" and "WEBP", so the 12-byte header is there.
  const uint64_t riff_bytes = 8 + (static_cast<uint64_t>(bytes[4]) | bytes[5] << 8 |
                                   bytes[6] << 16 | static_cast<uint64_t>(bytes[7]) << 24);
  if (riff_bytes > bytes.size()) {
    return invalid_argument("corrupt WebP: truncated, the RIFF header declares " +
                            std::to_string(riff_bytes) + " bytes but " +
                            std::to_string(bytes.size()) + " are present");
  }
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status != VP8_STATUS_OK)
    return invalid_argument("corrupt WebP: " + vp8_status_name(status));
  RETURN_IF_ERROR(check_image_size(features.width, features.height, options));

  WebPAnimDecoderOptions decoder_options;
  if (!WebPAnimDecoderOptionsInit(&decoder_options))
    return invalid_argument("corrupt WebP: libwebp version mismatch");
  decoder_options.color_mode = MODE_RGBA;
  decoder_options.use_threads = 0;
  WebPData data = {bytes.data(), bytes.size()};
  std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> decoder(
      WebPAnimDecoderNew(&data, &decoder_options));
  if (decoder == nullptr)
    return invalid_argument("corrupt WebP: libwebp could not parse the container");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info))
    return invalid_argument("corrupt WebP: libwebp could not read the canvas");
  // WebPGetFeatures already reported the canvas (VP8X) size; this only guards a disagreement.
  RETURN_IF_ERROR(check_image_size(info.canvas_width, info.canvas_height, options));
  uint8_t* canvas = nullptr;
  int timestamp_ms = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &canvas, &timestamp_ms))
    return invalid_argument("corrupt WebP: the first frame does not decode");

  RgbImage image;
  image.width = static_cast<int32_t>(info.canvas_width);
  image.height = static_cast<int32_t>(info.canvas_height);
  const int64_t num_pixels = static_cast<int64_t>(image.width) * image.height;
  image.rgb.resize(num_pixels * 3);
  if (features.has_alpha) {
    composite_rgba_on_white(canvas, num_pixels, image.rgb.data());
  } else {
    for (int64_t i = 0; i < num_pixels; ++i)
      std::memcpy(image.rgb.data() + i * 3, canvas + i * 4, 3);
  }
  return image;
}

}  // namespace crescent::media::internal
