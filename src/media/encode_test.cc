// encode_png / encode_jpeg round trips through decode_image.

#include "media/encode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include "media/decode.h"

namespace crescent::media {
namespace {

// Noise over a smooth gradient, so that PNG filters and JPEG blocks both have work to do.
RgbImage test_image(int width, int height, uint32_t seed, int noise) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width) * height * 3);
  uint32_t x = seed * 2654435761u + 1;
  for (int y = 0; y < height; ++y) {
    for (int c = 0; c < width; ++c) {
      for (int k = 0; k < 3; ++k) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        const int base = (k == 0 ? c * 255 / width : k == 1 ? y * 255 / height : (c + y) % 256);
        const int v = base + static_cast<int>(x % (2 * noise + 1)) - noise;
        image.rgb[(static_cast<size_t>(y) * width + c) * 3 + k] =
            static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
      }
    }
  }
  return image;
}

TEST(EncodePngTest, RoundTripIsExact) {
  for (int level : {-1, 0, 1, 9}) {
    for (auto [w, h] : {std::pair{1, 1}, std::pair{7, 3}, std::pair{64, 48}, std::pair{333, 17}}) {
      RgbImage image = test_image(w, h, static_cast<uint32_t>(w * 31 + h), 255);
      PngEncodeOptions options;
      options.compression_level = level;
      auto png = encode_png(image, options);
      ASSERT_TRUE(png.is_ok()) << png.status().to_string();
      ASSERT_GE(png->size(), 8u);
      EXPECT_EQ((*png)[0], 0x89);
      EXPECT_EQ((*png)[1], 'P');
      auto back = decode_image(*png);
      ASSERT_TRUE(back.is_ok()) << back.status().to_string();
      EXPECT_EQ(back->width, w);
      EXPECT_EQ(back->height, h);
      EXPECT_EQ(back->rgb, image.rgb) << w << "x" << h << " level " << level;
    }
  }
}

TEST(EncodePngTest, SmoothImagesCompress) {
  RgbImage image = test_image(256, 256, 1, 0);
  auto png = encode_png(image);
  ASSERT_TRUE(png.is_ok());
  EXPECT_LT(png->size(), image.rgb.size() / 4);
}

TEST(EncodeJpegTest, RoundTripIsClose) {
  for (auto [w, h] : {std::pair{16, 16}, std::pair{97, 61}, std::pair{448, 448}}) {
    RgbImage image = test_image(w, h, 7, 2);
    auto jpeg = encode_jpeg(image, 95);
    ASSERT_TRUE(jpeg.is_ok()) << jpeg.status().to_string();
    EXPECT_EQ((*jpeg)[0], 0xFF);
    EXPECT_EQ((*jpeg)[1], 0xD8);
    auto back = decode_image(*jpeg);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_EQ(back->width, w);
    ASSERT_EQ(back->height, h);
    double sum_abs = 0;
    for (size_t i = 0; i < image.rgb.size(); ++i) {
      sum_abs += std::abs(static_cast<int>(back->rgb[i]) - static_cast<int>(image.rgb[i]));
    }
    EXPECT_LT(sum_abs / static_cast<double>(image.rgb.size()), 3.0) << w << "x" << h;
  }
}

TEST(EncodeJpegTest, LowerQualityIsSmaller) {
  RgbImage image = test_image(128, 128, 3, 20);
  auto high = encode_jpeg(image, 95);
  auto low = encode_jpeg(image, 20);
  ASSERT_TRUE(high.is_ok() && low.is_ok());
  EXPECT_LT(low->size(), high->size());
}

TEST(EncodeJpegTest, LargeNoiseGrowsTheBuffer) {
  // Noise at quality 100 is bigger than the 64 KiB first buffer: the destination must grow.
  RgbImage image = test_image(512, 384, 11, 255);
  auto jpeg = encode_jpeg(image, 100);
  ASSERT_TRUE(jpeg.is_ok());
  EXPECT_GT(jpeg->size(), size_t{64} << 10);
  auto back = decode_image(*jpeg);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->width, 512);
}

TEST(EncodeTest, BadInputIsAnError) {
  RgbImage empty;
  EXPECT_EQ(encode_png(empty).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_jpeg(empty, 75).status().code(), StatusCode::kInvalidArgument);
  RgbImage short_buffer;
  short_buffer.width = 4;
  short_buffer.height = 4;
  short_buffer.rgb.resize(47);
  EXPECT_EQ(encode_png(short_buffer).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_jpeg(short_buffer, 75).status().code(), StatusCode::kInvalidArgument);
  RgbImage ok = test_image(4, 4, 1, 0);
  EXPECT_EQ(encode_jpeg(ok, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_jpeg(ok, 101).status().code(), StatusCode::kInvalidArgument);
  PngEncodeOptions bad_level;
  bad_level.compression_level = 10;
  EXPECT_EQ(encode_png(ok, bad_level).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::media
