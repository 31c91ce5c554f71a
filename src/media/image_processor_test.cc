#include "media/image_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "media/test_images.h"

namespace crescent::media {
namespace {

struct SmartResizeCase {
  int height, width, factor;
  int64_t min_pixels, max_pixels;
  int expected_height, expected_width;
};

// Worked by hand from transformers' smart_resize (factor 28, min 56*56, max 28*28*1280 unless
// noted): round(x / 28) with ties to even, then floor/ceil through beta when out of range.
TEST(SmartResizeTest, MatchesTheReferenceFormula) {
  const int64_t kMin = 56 * 56;
  const int64_t kMax = 28 * 28 * 1280;
  const SmartResizeCase cases[] = {
      // 28 -> 28x28 = 784 < 3136: beta = 2, ceil(28 * 2 / 28) = 2 -> 56.
      {28, 28, 28, kMin, kMax, 56, 56},
      // round(10 / 28) = 0 -> 0 < 3136: beta = 5.6, ceil(10 * 5.6 / 28) = 2 -> 56.
      {10, 10, 28, kMin, kMax, 56, 56},
      {1, 1, 28, kMin, kMax, 56, 56},
      // 720 / 28 = 25.7 -> 26 -> 728; 1280 / 28 = 45.7 -> 46 -> 1288; 937664 is in range.
      {720, 1280, 28, kMin, kMax, 728, 1288},
      // Ties go to even: 42 / 28 = 1.5 -> 2, 70 / 28 = 2.5 -> 2, 98 / 28 = 3.5 -> 4.
      {42, 70, 28, kMin, kMax, 56, 56},
      {70, 98, 28, kMin, kMax, 56, 112},
      // 517 / 28 = 18.46 -> 18 -> 504; 333 / 28 = 11.89 -> 12 -> 336.
      {517, 333, 28, kMin, kMax, 504, 336},
      // 4004 x 2996 > max: beta = sqrt(12e6 / 1003520) = 3.458; floor(41.3) = 41 -> 1148,
      // floor(30.98) = 30 -> 840.
      {4000, 3000, 28, kMin, kMax, 1148, 840},
      {1200, 1600, 28, kMin, kMax, 840, 1148},
      // Aspect ratio exactly 200 is allowed: 0 x 196 < min; beta = 3.96, ceil(0.14) = 1 -> 28,
      // ceil(28.28) = 29 -> 812.
      {1, 200, 28, kMin, kMax, 28, 812},
      {1000, 5, 28, kMin, kMax, 812, 28},
      // floor(30 / 4.374 / 28) = 0 is lifted to one factor.
      {30, 5000, 28, kMin, 28 * 28 * 10, 28, 1120},
      // Qwen2-VL's shipped max_pixels (12845056) and another factor.
      {2048, 2048, 28, kMin, 12845056, 2044, 2044},
      {100, 100, 32, 4096, 16777216, 96, 96},
  };
  for (const auto& c : cases) {
    auto result = smart_resize(c.height, c.width, c.factor, c.min_pixels, c.max_pixels);
    ASSERT_TRUE(result.is_ok()) << c.height << "x" << c.width << ": "
                                << result.status().to_string();
    EXPECT_EQ(result->first, c.expected_height) << c.height << "x" << c.width;
    EXPECT_EQ(result->second, c.expected_width) << c.height << "x" << c.width;
  }
}

TEST(SmartResizeTest, RefusesWhereTheReferenceRaises) {
  auto strip = smart_resize(1, 5000, 28, 3136, 1003520);
  ASSERT_FALSE(strip.is_ok());
  EXPECT_EQ(strip.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(strip.status().message(), "absolute aspect ratio must be smaller than 200, got 5000.0");
  EXPECT_EQ(smart_resize(201, 1, 28, 3136, 1003520).status().message(),
            "absolute aspect ratio must be smaller than 200, got 201.0");
  EXPECT_EQ(smart_resize(3, 700, 28, 3136, 1003520).status().message(),
            "absolute aspect ratio must be smaller than 200, got 233.33333333333334");
  EXPECT_FALSE(smart_resize(0, 10, 28, 3136, 1003520).is_ok());
  EXPECT_FALSE(smart_resize(10, -1, 28, 3136, 1003520).is_ok());
  // min_pixels 0 lets a tiny image round to 0 rows: an empty result is refused.
  EXPECT_FALSE(smart_resize(10, 100, 28, 0, 1003520).is_ok());
}

RgbImage constant_image(int w, int h, uint8_t v) {
  return RgbImage{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, v)};
}

TEST(ResizeBicubicTest, SameSizeIsACopyAndConstantsStayConstant) {
  RgbImage image{5, 4, testing::pattern(60, 1)};
  EXPECT_EQ(resize_bicubic(image, 5, 4).rgb, image.rgb);
  for (auto [w, h] : {std::pair{64, 90}, std::pair{3, 2}, std::pair{37, 7}, std::pair{37, 50}}) {
    RgbImage out = resize_bicubic(constant_image(37, 23, 200), w, h);
    EXPECT_EQ(out.width, w);
    EXPECT_EQ(out.height, h);
    EXPECT_EQ(out.rgb, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 200));
  }
}

TEST(ResizeBicubicTest, TwoToOneByHand) {
  // in 2 -> out 1: scale 2, support 4, centre 1.0; both taps at distance 0.25 weigh the same,
  // so each gets 2^21 after normalisation and the result is floor((1 + a + b) / 2).
  RgbImage image{2, 1, {10, 0, 255, 21, 1, 254}};
  RgbImage out = resize_bicubic(image, 1, 1);
  EXPECT_EQ(out.rgb, (std::vector<uint8_t>{16, 1, 255}));
}

TEST(PreprocessImageTest, PatchOrderFollowsTheReferenceTranspose) {
  // 56x56 needs no resize (smart_resize(56, 56) = (56, 56)); with rescale and normalize off the
  // values are the bytes, R = 4x, G = 4y, B = 7, so every element names its source pixel.
  RgbImage image{56, 56, std::vector<uint8_t>(56 * 56 * 3)};
  for (int y = 0; y < 56; ++y) {
    for (int x = 0; x < 56; ++x) {
      uint8_t* p = image.rgb.data() + (y * 56 + x) * 3;
      p[0] = static_cast<uint8_t>(4 * x);
      p[1] = static_cast<uint8_t>(4 * y);
      p[2] = 7;
    }
  }
  ImageProcessorConfig config;
  config.do_rescale = false;
  config.do_normalize = false;
  auto patches = preprocess_image(image, config);
  ASSERT_TRUE(patches.is_ok()) << patches.status().to_string();
  EXPECT_EQ(patches->grid_t, 1);
  EXPECT_EQ(patches->grid_h, 4);
  EXPECT_EQ(patches->grid_w, 4);
  EXPECT_EQ(patches->patch_dim, 3 * 2 * 14 * 14);
  EXPECT_EQ(patches->num_patches(), 16);
  EXPECT_EQ(patches->num_merged_tokens(2), 4);
  ASSERT_EQ(patches->values.size(), 16u * 1176);
  // Element [row][col] of the (t, H/m, W/m, m, m) x (C, tp, p, p) reshape.
  for (int row = 0; row < 16; ++row) {
    const int bh = row / 8, bw = (row / 4) % 2, mh = (row / 2) % 2, mw = row % 2;
    for (int col = 0; col < 1176; ++col) {
      const int c = col / 392, py = (col / 14) % 14, px = col % 14;
      const int y = (bh * 2 + mh) * 14 + py;
      const int x = (bw * 2 + mw) * 14 + px;
      const float expected = c == 0 ? 4.0f * x : (c == 1 ? 4.0f * y : 7.0f);
      ASSERT_EQ(patches->values[row * 1176 + col], expected) << row << "," << col;
    }
  }
}

TEST(PreprocessImageTest, NormalizesInFloat32) {
  ImageProcessorConfig config;
  auto patches = preprocess_image(constant_image(56, 56, 200), config);
  ASSERT_TRUE(patches.is_ok());
  for (int c = 0; c < 3; ++c) {
    float x = static_cast<float>(200.0 * (1.0 / 255));
    float expected = (x - config.image_mean[c]) / config.image_std[c];
    EXPECT_EQ(patches->values[c * 392], expected);
  }
}

TEST(PreprocessImageTest, ResizesTinyImagesAndRefusesStrips) {
  auto tiny = preprocess_image(constant_image(10, 10, 9), ImageProcessorConfig{});
  ASSERT_TRUE(tiny.is_ok());
  EXPECT_EQ(tiny->grid_h, 4);
  EXPECT_EQ(tiny->grid_w, 4);
  auto strip = preprocess_image(constant_image(5000, 1, 9), ImageProcessorConfig{});
  EXPECT_EQ(strip.status().code(), StatusCode::kInvalidArgument);
  ImageProcessorConfig no_resize;
  no_resize.do_resize = false;
  EXPECT_FALSE(preprocess_image(constant_image(30, 28, 9), no_resize).is_ok());
  EXPECT_TRUE(preprocess_image(constant_image(28, 56, 9), no_resize).is_ok());
}

TEST(PatchGridTest, EqualsTheGridPreprocessingGives) {
  ImageProcessorConfig config;
  config.max_pixels = 28 * 28 * 300;
  for (auto [w, h] : {std::pair{10, 10}, std::pair{200, 120}, std::pair{28, 28},
                      std::pair{640, 480}, std::pair{1000, 37}}) {
    auto patches = preprocess_image(constant_image(w, h, 7), config);
    ASSERT_TRUE(patches.is_ok()) << patches.status().to_string();
    auto grid = patch_grid(h, w, config);
    ASSERT_TRUE(grid.is_ok()) << grid.status().to_string();
    EXPECT_EQ(grid->grid_t, patches->grid_t) << w << "x" << h;
    EXPECT_EQ(grid->grid_h, patches->grid_h) << w << "x" << h;
    EXPECT_EQ(grid->grid_w, patches->grid_w) << w << "x" << h;
  }
  EXPECT_FALSE(patch_grid(5000, 1, config).is_ok());  // the strip preprocessing refuses
  config.do_resize = false;
  EXPECT_FALSE(patch_grid(30, 28, config).is_ok());
  auto exact = patch_grid(56, 84, config);
  ASSERT_TRUE(exact.is_ok());
  EXPECT_EQ(exact->grid_h, 4);
  EXPECT_EQ(exact->grid_w, 6);
}

TEST(PreprocessorConfigTest, ParsesQwen2VlAndNewerSizeStyle) {
  // Qwen2-VL-7B-Instruct's preprocessor_config.json.
  auto qwen2 = parse_preprocessor_config(R"({
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"})");
  ASSERT_TRUE(qwen2.is_ok()) << qwen2.status().to_string();
  EXPECT_EQ(qwen2->min_pixels, 3136);
  EXPECT_EQ(qwen2->max_pixels, 12845056);
  ImageProcessorConfig defaults;
  EXPECT_EQ(qwen2->image_mean, defaults.image_mean);
  EXPECT_EQ(qwen2->image_std, defaults.image_std);
  EXPECT_EQ(qwen2->rescale_factor, 1.0 / 255);

  auto sized = parse_preprocessor_config(R"({"size": {"shortest_edge": 1000,
    "longest_edge": 2000000}, "rescale_factor": 0.00392156862745098, "do_normalize": false,
    "image_mean": 0.5, "resample": 3})");
  ASSERT_TRUE(sized.is_ok()) << sized.status().to_string();
  EXPECT_EQ(sized->min_pixels, 1000);
  EXPECT_EQ(sized->max_pixels, 2000000);
  EXPECT_FALSE(sized->do_normalize);
  EXPECT_EQ(sized->image_mean, (std::array<float, 3>{0.5f, 0.5f, 0.5f}));
  // Top-level min/max override size, as the processor's constructor does.
  auto both = parse_preprocessor_config(
      R"({"size": {"shortest_edge": 1000, "longest_edge": 2000000}, "max_pixels": 5000})");
  ASSERT_TRUE(both.is_ok());
  EXPECT_EQ(both->min_pixels, 1000);
  EXPECT_EQ(both->max_pixels, 5000);
  EXPECT_TRUE(parse_preprocessor_config("{}").is_ok());
}

TEST(PreprocessorConfigTest, BadFieldsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"patch_size": "14"})", "'patch_size'"},
      {R"({"merge_size": 0})", "'merge_size'"},
      {R"({"image_mean": [0.5, 0.5]})", "'image_mean'"},
      {R"({"image_std": [0.5, 0, 0.5]})", "'image_std'"},
      {R"({"size": {"shortest_edge": 10}})", "'size'"},
      {R"({"min_pixels": 100, "max_pixels": 10})", "'min_pixels'"},
      {R"({"do_resize": 1})", "'do_resize'"},
      {R"({"rescale_factor": "x"})", "'rescale_factor'"},
      {R"({"resample": 2})", "'resample'"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"patch_size": )", "preprocessor_config.json: "},
  };
  for (const auto& [text, needle] : cases) {
    auto result = parse_preprocessor_config(text);
    ASSERT_FALSE(result.is_ok()) << text;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(result.status().message().find(needle), std::string::npos)
        << text << " -> " << result.status().message();
  }
}

bool same_config(const ImageProcessorConfig& a, const ImageProcessorConfig& b) {
  return a.patch_size == b.patch_size && a.temporal_patch_size == b.temporal_patch_size &&
         a.merge_size == b.merge_size && a.min_pixels == b.min_pixels &&
         a.max_pixels == b.max_pixels && a.image_mean == b.image_mean &&
         a.image_std == b.image_std && a.rescale_factor == b.rescale_factor &&
         a.do_resize == b.do_resize && a.do_rescale == b.do_rescale &&
         a.do_normalize == b.do_normalize;
}

TEST(PreprocessorConfigTest, JsonRoundTrips) {
  ImageProcessorConfig defaults;
  std::string text = to_preprocessor_config_json(defaults, "Qwen2VLImageProcessor");
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["image_processor_type"], "Qwen2VLImageProcessor");
  // A short decimal that Python reads back, through numpy float32, as the same float.
  EXPECT_EQ(static_cast<float>(j["image_mean"][0].get<double>()), defaults.image_mean[0]);
  EXPECT_LE(j["image_mean"][0].dump().size(), 11u) << j["image_mean"][0].dump();
  EXPECT_EQ(j["size"]["longest_edge"], 1003520);
  auto back = parse_preprocessor_config(text);
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(same_config(*back, defaults));

  ImageProcessorConfig custom;
  custom.patch_size = 16;
  custom.merge_size = 3;
  custom.temporal_patch_size = 1;
  custom.min_pixels = 1234;
  custom.max_pixels = 987654;
  custom.image_mean = {0.5f, 0.25f, 0.125f};
  custom.image_std = {0.1f, 0.2f, 0.3f};
  custom.rescale_factor = 0.5;
  custom.do_resize = false;
  custom.do_rescale = false;
  custom.do_normalize = false;
  back = parse_preprocessor_config(to_preprocessor_config_json(custom, "Qwen2VLImageProcessor"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(same_config(*back, custom));
}

TEST(ImageHashTest, EqualInputsHashEqualAndAnyChangeDiffers) {
  RgbImage image{6, 4, testing::pattern(72, 2)};
  ImageProcessorConfig config;
  const std::string base = image_hash(image, config);
  EXPECT_EQ(base.size(), 32u);
  EXPECT_EQ(base.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(image_hash(RgbImage(image), ImageProcessorConfig{}), base);

  RgbImage changed = image;
  changed.rgb[71] ^= 1;
  EXPECT_NE(image_hash(changed, config), base);
  RgbImage transposed{4, 6, image.rgb};
  EXPECT_NE(image_hash(transposed, config), base);

  std::vector<ImageProcessorConfig> variants(11, config);
  variants[0].patch_size = 16;
  variants[1].temporal_patch_size = 1;
  variants[2].merge_size = 1;
  variants[3].min_pixels += 1;
  variants[4].max_pixels += 1;
  variants[5].image_mean[2] = 0.5f;
  variants[6].image_std[0] = 0.5f;
  variants[7].rescale_factor = 1.0 / 256;
  variants[8].do_resize = false;
  variants[9].do_rescale = false;
  variants[10].do_normalize = false;
  for (size_t i = 0; i < variants.size(); ++i)
    EXPECT_NE(image_hash(image, variants[i]), base) << "variant " << i;
}

}  // namespace
}  // namespace crescent::media
