#include "media/decode.h"

#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "media/test_images.h"

namespace crescent::media {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::encode_webp_lossless_rgba;
using testing::encode_webp_lossy_rgb;
using testing::pattern;

RgbImage decode_ok(const std::vector<uint8_t>& bytes) {
  auto result = decode_image(bytes);
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  return result.is_ok() ? *result : RgbImage{};
}

Status decode_error(const std::vector<uint8_t>& bytes, const DecodeOptions& options = {}) {
  auto result = decode_image(bytes, options);
  EXPECT_FALSE(result.is_ok());
  return result.status();
}

// PIL's paste blend of a colour over white.
uint8_t over_white(int c, int a) {
  int v = 255 * (255 - a) + c * a + 128;
  return static_cast<uint8_t>(((v >> 8) + v) >> 8);
}

int max_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

// A smooth RGB gradient that JPEG and lossy WebP keep close.
std::vector<uint8_t> gradient(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = rgb.data() + (static_cast<size_t>(y) * w + x) * 3;
      p[0] = static_cast<uint8_t>(x * 255 / (w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / (h - 1));
      p[2] = 128;
    }
  }
  return rgb;
}

TEST(DecodeTest, RejectsDataThatIsNoImage) {
  for (std::string text : {std::string(""), std::string("hello world"), std::string("GIF89a..."),
                           std::string("\x89PNG", 4), std::string("RIFF\0\0\0\0WAVE", 12)}) {
    std::vector<uint8_t> bytes(text.begin(), text.end());
    Status status = decode_error(bytes);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), "image data is not PNG, JPEG or WebP");
  }
}

TEST(DecodeTest, RgbPngIsExact) {
  auto rgb = pattern(7 * 5 * 3, 1);
  RgbImage image = decode_ok(encode_png(7, 5, PNG_COLOR_TYPE_RGB, 8, rgb));
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.height, 5);
  EXPECT_EQ(image.rgb, rgb);
}

TEST(DecodeTest, InterlacedPngMatchesPlain) {
  auto rgb = pattern(33 * 17 * 3, 2);
  RgbImage image = decode_ok(encode_png(33, 17, PNG_COLOR_TYPE_RGB, 8, rgb, {}, {}, true));
  EXPECT_EQ(image.rgb, rgb);
}

TEST(DecodeTest, RgbaPngIsCompositedOverWhite) {
  // Hand-computed PIL blends: alpha 0 -> white, 255 -> the colour, 128 over 0 -> 127.
  std::vector<uint8_t> rgba = {0, 0, 0, 128, 10, 20, 30, 0, 10, 20, 30, 255, 200, 100, 0, 64};
  RgbImage image = decode_ok(encode_png(4, 1, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba));
  std::vector<uint8_t> expected = {127,
                                   127,
                                   127,
                                   255,
                                   255,
                                   255,
                                   10,
                                   20,
                                   30,
                                   over_white(200, 64),
                                   over_white(100, 64),
                                   over_white(0, 64)};
  EXPECT_EQ(image.rgb, expected);
  EXPECT_EQ(over_white(200, 64), 241);  // (255*191 + 200*64 + 128) / 255 by DIV255
}

TEST(DecodeTest, GreyPngsReplicateAndScale) {
  RgbImage l8 = decode_ok(encode_png(3, 1, PNG_COLOR_TYPE_GRAY, 8, {0, 77, 255}));
  EXPECT_EQ(l8.rgb, (std::vector<uint8_t>{0, 0, 0, 77, 77, 77, 255, 255, 255}));
  // 2-bit grey scales by 0x55, as PIL's L;2 unpacker; tRNS is ignored.
  RgbImage l2 = decode_ok(encode_png(4, 1, PNG_COLOR_TYPE_GRAY, 2, {0, 1, 2, 3}, {}, {1}));
  EXPECT_EQ(l2.rgb, (std::vector<uint8_t>{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  RgbImage l1 = decode_ok(encode_png(2, 1, PNG_COLOR_TYPE_GRAY, 1, {1, 0}));
  EXPECT_EQ(l1.rgb, (std::vector<uint8_t>{255, 255, 255, 0, 0, 0}));
}

TEST(DecodeTest, SixteenBitPngsFollowPil) {
  // RGB 16: the high byte. Grey 16: PIL's I;16 -> RGB clips the value at 255.
  RgbImage rgb16 =
      decode_ok(encode_png(1, 1, PNG_COLOR_TYPE_RGB, 16, {0x12, 0x34, 0xAB, 0xCD, 0x00, 0xFF}));
  EXPECT_EQ(rgb16.rgb, (std::vector<uint8_t>{0x12, 0xAB, 0x00}));
  RgbImage grey16 =
      decode_ok(encode_png(3, 1, PNG_COLOR_TYPE_GRAY, 16, {0x00, 0x07, 0x00, 0xFF, 0x01, 0x00}));
  EXPECT_EQ(grey16.rgb, (std::vector<uint8_t>{7, 7, 7, 255, 255, 255, 255, 255, 255}));
  // Grey+alpha 16 opens as RGBA in PIL (high bytes), so it is composited.
  RgbImage la16 =
      decode_ok(encode_png(1, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16, {0x40, 0x99, 0x80, 0x11}));
  EXPECT_EQ(la16.rgb[0], over_white(0x40, 0x80));
  // RGBA 16: high bytes, composited.
  RgbImage rgba16 = decode_ok(
      encode_png(1, 1, PNG_COLOR_TYPE_RGB_ALPHA, 16, {0x10, 0, 0x20, 0, 0x30, 0, 0x40, 0xFF}));
  EXPECT_EQ(rgba16.rgb, (std::vector<uint8_t>{over_white(0x10, 0x40), over_white(0x20, 0x40),
                                              over_white(0x30, 0x40)}));
}

TEST(DecodeTest, GreyAlphaPngDropsAlpha) {
  RgbImage la = decode_ok(encode_png(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {90, 0, 200, 128}));
  EXPECT_EQ(la.rgb, (std::vector<uint8_t>{90, 90, 90, 200, 200, 200}));
}

TEST(DecodeTest, PalettePngIgnoresTransparencyAndRampsMissingEntries) {
  std::vector<uint8_t> palette = {255, 0, 0, 0, 255, 0};
  std::vector<uint8_t> trns = {0, 128};
  // Index 7 is past the two PLTE entries: PIL's palette there is its initial grey ramp.
  RgbImage image = decode_ok(encode_png(3, 1, PNG_COLOR_TYPE_PALETTE, 4, {0, 1, 7}, palette, trns));
  EXPECT_EQ(image.rgb, (std::vector<uint8_t>{255, 0, 0, 0, 255, 0, 7, 7, 7}));
}

TEST(DecodeTest, JpegRgbGreyAndCmyk) {
  auto rgb = gradient(40, 24);
  RgbImage colour = decode_ok(encode_jpeg(40, 24, 3, rgb, 95));
  EXPECT_EQ(colour.width, 40);
  EXPECT_EQ(colour.height, 24);
  EXPECT_LE(max_abs_diff(colour.rgb, rgb), 12);

  std::vector<uint8_t> grey(16 * 8);
  for (size_t i = 0; i < grey.size(); ++i)
    grey[i] = static_cast<uint8_t>(i * 2);
  RgbImage g = decode_ok(encode_jpeg(16, 8, 1, grey, 100));
  for (size_t i = 0; i < grey.size(); ++i) {
    EXPECT_EQ(g.rgb[i * 3], g.rgb[i * 3 + 1]);
    EXPECT_EQ(g.rgb[i * 3], g.rgb[i * 3 + 2]);
    EXPECT_NEAR(g.rgb[i * 3], grey[i], 3);
  }

  // Stored CMYK (255, 0, 255, 255) read the Adobe way (inverted): C=0, M=255, Y=0, K=0, which
  // PIL's cmyk2rgb makes (255, 0, 255). YCCK decodes to the same stored CMYK.
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 16 * 16; ++i)
    cmyk.insert(cmyk.end(), {255, 0, 255, 255});
  for (bool ycck : {false, true}) {
    RgbImage c = decode_ok(encode_jpeg(16, 16, 4, cmyk, 100, ycck));
    ASSERT_EQ(c.rgb.size(), 16u * 16 * 3);
    EXPECT_NEAR(c.rgb[0], 255, 2) << "ycck " << ycck;
    EXPECT_NEAR(c.rgb[1], 0, 2) << "ycck " << ycck;
    EXPECT_NEAR(c.rgb[2], 255, 2) << "ycck " << ycck;
  }
  // Stored K = 128 halves every channel: nk = 128, c = 255 - 255 = 0 -> 128.
  std::vector<uint8_t> grey_k;
  for (int i = 0; i < 8 * 8; ++i)
    grey_k.insert(grey_k.end(), {255, 255, 255, 128});
  RgbImage half = decode_ok(encode_jpeg(8, 8, 4, grey_k, 100));
  EXPECT_NEAR(half.rgb[0], 128, 2);
}

TEST(DecodeTest, WebpLosslessAlphaAndLossy) {
  std::vector<uint8_t> rgba = pattern(9 * 6 * 4, 3);
  RgbImage image = decode_ok(encode_webp_lossless_rgba(9, 6, rgba));
  ASSERT_EQ(image.rgb.size(), 9u * 6 * 3);
  for (int i = 0; i < 9 * 6; ++i) {
    for (int c = 0; c < 3; ++c) {
      // Lossless WebP may rewrite the colour of fully transparent pixels; white either way.
      EXPECT_EQ(image.rgb[i * 3 + c], over_white(rgba[i * 4 + c], rgba[i * 4 + 3])) << i;
    }
  }
  auto rgb = gradient(32, 32);
  RgbImage lossy = decode_ok(encode_webp_lossy_rgb(32, 32, rgb, 95));
  EXPECT_EQ(lossy.width, 32);
  EXPECT_LE(max_abs_diff(lossy.rgb, rgb), 16);
}

TEST(DecodeTest, TruncatedImagesFail) {
  auto png = encode_png(64, 64, PNG_COLOR_TYPE_RGB, 8, pattern(64 * 64 * 3, 4));
  auto jpeg = encode_jpeg(64, 64, 3, pattern(64 * 64 * 3, 5), 90);
  auto webp = encode_webp_lossless_rgba(64, 64, pattern(64 * 64 * 4, 6));
  for (const auto* bytes : {&png, &jpeg, &webp}) {
    std::vector<uint8_t> half(bytes->begin(), bytes->begin() + bytes->size() / 2);
    Status status = decode_error(half);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("truncated"), std::string::npos) << status.message();
  }
}

TEST(DecodeTest, CorruptJpegNamesLibjpegError) {
  auto jpeg = encode_jpeg(16, 16, 3, pattern(16 * 16 * 3, 7), 90);
  // Break the SOF marker's precision byte (8 -> 3 bits), which libjpeg refuses.
  for (size_t i = 2; i + 4 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 4] = 3;
      break;
    }
  }
  Status status = decode_error(jpeg);
  EXPECT_EQ(status.message().rfind("corrupt JPEG: ", 0), 0u) << status.message();
}

// Rewrites the IHDR size of a PNG (and its CRC).
std::vector<uint8_t> png_claiming(uint32_t width, uint32_t height) {
  auto png = encode_png(2, 2, PNG_COLOR_TYPE_RGB_ALPHA, 8, pattern(16, 8));
  uint8_t* ihdr = png.data() + 8 + 8;  // signature, length, "IHDR"
  for (int i = 0; i < 4; ++i) {
    ihdr[i] = static_cast<uint8_t>(width >> (24 - 8 * i));
    ihdr[4 + i] = static_cast<uint8_t>(height >> (24 - 8 * i));
  }
  uint32_t crc = crc32(0, png.data() + 12, 4 + 13);
  for (int i = 0; i < 4; ++i)
    png[8 + 8 + 13 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  return png;
}

TEST(DecodeTest, HugeDimensionsAreRefusedFromTheHeader) {
  const std::string message =
      "image of 20000x20000 = 400000000 pixels exceeds the limit of 50000000";
  // The pixel data is only a few bytes: reading it would fail as truncated or corrupt, so the
  // size message proves the check ran before any pixel buffer was made.
  EXPECT_EQ(decode_error(png_claiming(20000, 20000)).message(), message);

  auto jpeg = encode_jpeg(8, 8, 3, pattern(8 * 8 * 3, 9), 90);
  for (size_t i = 2; i + 8 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = 20000 >> 8;
      jpeg[i + 6] = 20000 & 0xFF;
      jpeg[i + 7] = 20000 >> 8;
      jpeg[i + 8] = 20000 & 0xFF;
      break;
    }
  }
  EXPECT_EQ(decode_error(jpeg).message(), message);

  // VP8L header after "RIFF....WEBPVP8L....\x2f": 14 bits width-1, 14 bits height-1.
  auto webp = encode_webp_lossless_rgba(1, 1, {1, 2, 3, 255});
  ASSERT_EQ(std::memcmp(webp.data() + 12, "VP8L", 4), 0);
  uint32_t bits = 0;
  std::memcpy(&bits, webp.data() + 21, 4);
  bits = (bits & ~0x0FFFFFFFu) | 16383u | (16383u << 14);
  std::memcpy(webp.data() + 21, &bits, 4);
  EXPECT_EQ(decode_error(webp).message(),
            "image of 16384x16384 = 268435456 pixels exceeds the limit of 50000000");
}

TEST(DecodeTest, MaxPixelsIsInclusive) {
  auto png = encode_png(10, 10, PNG_COLOR_TYPE_RGB, 8, pattern(300, 10));
  EXPECT_TRUE(decode_image(png, DecodeOptions{.max_pixels = 100}).is_ok());
  EXPECT_EQ(decode_error(png, DecodeOptions{.max_pixels = 99}).message(),
            "image of 10x10 = 100 pixels exceeds the limit of 99");
}

TEST(DecodeTest, DamagedImagesFailCleanly) {
  // Every prefix and a spread of single-byte corruptions of one image per format: each decode
  // either succeeds or is InvalidArgument (run under ASan this covers the longjmp paths).
  std::vector<uint8_t> indices = pattern(12 * 9, 12);
  for (uint8_t& i : indices)
    i %= 10;
  std::vector<std::vector<uint8_t>> images = {
      encode_png(12, 9, PNG_COLOR_TYPE_RGB_ALPHA, 8, pattern(12 * 9 * 4, 11)),
      encode_png(12, 9, PNG_COLOR_TYPE_PALETTE, 8, indices, pattern(30, 13)),
      encode_jpeg(24, 16, 3, pattern(24 * 16 * 3, 14), 80),
      encode_jpeg(16, 16, 4, pattern(16 * 16 * 4, 15), 80),
      encode_webp_lossless_rgba(12, 9, pattern(12 * 9 * 4, 16)),
      encode_webp_lossy_rgb(16, 16, pattern(16 * 16 * 3, 17), 70),
  };
  int num_decoded = 0;
  int num_refused = 0;
  for (const auto& image : images) {
    for (size_t length = 0; length <= image.size(); ++length) {
      std::vector<uint8_t> prefix(image.begin(), image.begin() + length);
      auto result = decode_image(prefix);
      if (result.is_ok()) {
        ++num_decoded;
        EXPECT_EQ(result->rgb.size(), static_cast<size_t>(result->width) * result->height * 3);
      } else {
        ++num_refused;
        EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
      }
    }
    auto noise = pattern(image.size() * 2, 99);
    for (size_t i = 0; i < image.size(); i += 3) {
      std::vector<uint8_t> damaged = image;
      damaged[i] ^= static_cast<uint8_t>(noise[i] | 1);
      auto result = decode_image(damaged);
      if (result.is_ok()) {
        ++num_decoded;
        EXPECT_EQ(result->rgb.size(), static_cast<size_t>(result->width) * result->height * 3);
      } else {
        ++num_refused;
        EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
  EXPECT_GT(num_refused, 0);
  EXPECT_GT(num_decoded, static_cast<int>(images.size()));
}

}  // namespace
}  // namespace crescent::media
