#include "server/multimodal_processor.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/base64.h"
#include "media/encode.h"
#include "media/image.h"

namespace crescent::server {
namespace {

using nlohmann::json;

std::shared_ptr<const MultimodalProcessor> make(bool needs_pixel_values) {
  MultimodalOptions options;
  options.needs_pixel_values = needs_pixel_values;
  auto p = MultimodalProcessor::create(media::ImageProcessorConfig{}, 2, 151655, options);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return *p;
}

std::string png_data_url(int width, int height) {
  media::RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.assign(static_cast<size_t>(width) * height * 3, 0);
  for (size_t i = 0; i < image.rgb.size(); ++i) {
    image.rgb[i] = static_cast<uint8_t>(i * 7);
  }
  auto png = media::encode_png(image);
  EXPECT_TRUE(png.is_ok());
  return "data:image/png;base64," + base64_encode(*png);
}

TEST(MultimodalProcessorTest, WithoutPixelValuesTheHashAndGridAreTheSame) {
  std::vector<ImageRef> images(1);
  images[0].url = png_data_url(200, 120);
  auto full = make(true)->prepare(images);
  auto light = make(false)->prepare(images);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_TRUE(light.is_ok()) << light.status().to_string();
  EXPECT_NE((*full)[0].input, nullptr);
  EXPECT_EQ((*light)[0].input, nullptr);
  EXPECT_EQ((*light)[0].mm_hash, (*full)[0].mm_hash);
  EXPECT_EQ((*light)[0].llm_grid_t, (*full)[0].llm_grid_t);
  EXPECT_EQ((*light)[0].llm_grid_h, (*full)[0].llm_grid_h);
  EXPECT_EQ((*light)[0].llm_grid_w, (*full)[0].llm_grid_w);
}

TEST(MultimodalProcessorTest, DeferredPixelValuesAreMadeOnlyForImagesWithoutEmbeddings) {
  std::vector<ImageRef> images(3);
  images[0].url = png_data_url(200, 120);
  images[1].url = png_data_url(64, 90);
  images[2].url = images[0].url;
  auto processor = make(true);
  auto now = processor->prepare(images);
  auto deferred = processor->prepare(images, MultimodalProcessor::PixelValues::kDeferred);
  ASSERT_TRUE(now.is_ok()) << now.status().to_string();
  ASSERT_TRUE(deferred.is_ok()) << deferred.status().to_string();
  for (size_t i = 0; i < images.size(); ++i) {
    const PreparedImage& d = (*deferred)[i];
    EXPECT_EQ(d.input, nullptr) << i;
    EXPECT_NE(d.deferred_rgb, nullptr) << i;
    EXPECT_EQ(d.mm_hash, (*now)[i].mm_hash) << i;
    EXPECT_EQ(d.num_tokens(), (*now)[i].num_tokens()) << i;
  }
  // Image 0 got its embeddings (pulled); 1 and 2 did not: they get the pixel values kNow gives.
  (*deferred)[0].embeddings = std::make_shared<const std::vector<float>>(8, 1.0f);
  ASSERT_TRUE(processor->make_pixel_values(*deferred).is_ok());
  EXPECT_EQ((*deferred)[0].input, nullptr);
  for (size_t i : {1u, 2u}) {
    ASSERT_NE((*deferred)[i].input, nullptr) << i;
    EXPECT_EQ((*deferred)[i].input->pixel_values, (*now)[i].input->pixel_values) << i;
    EXPECT_EQ((*deferred)[i].input->grid_h, (*now)[i].input->grid_h) << i;
  }
  for (const PreparedImage& image : *deferred) {
    EXPECT_EQ(image.deferred_rgb, nullptr);
  }
}

TEST(MultimodalProcessorTest, DecodeServersTakeHashAndGridFromFittingItemsOnly) {
  auto decode = make(false);
  const json item = {{"mm_hash", "abc"}, {"grid", {1, 4, 7}}, {"shape", {28, 64}}};
  auto got = decode->prepared_from_ec_params(json{{"items", {item, item}}}, 2);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[1].mm_hash, "abc");
  EXPECT_EQ((*got)[1].num_tokens(), 28);
  EXPECT_EQ((*got)[1].input, nullptr);

  EXPECT_FALSE(make(true)->prepared_from_ec_params(json{{"items", {item}}}, 1))
      << "a server that encodes prepares its own images";
  EXPECT_FALSE(decode->prepared_from_ec_params(json{{"items", {item}}}, 2)) << "count";
  json bad = item;
  bad["grid"] = {1, 4, 6};
  EXPECT_FALSE(decode->prepared_from_ec_params(json{{"items", {bad}}}, 1)) << "grid vs shape";
  bad = item;
  bad.erase("grid");
  EXPECT_FALSE(decode->prepared_from_ec_params(json{{"items", {bad}}}, 1)) << "no grid";
  bad = item;
  bad["grid"] = {1, 0, 28};
  EXPECT_FALSE(decode->prepared_from_ec_params(json{{"items", {bad}}}, 1)) << "zero side";
  bad = item;
  bad["mm_hash"] = 5;
  EXPECT_FALSE(decode->prepared_from_ec_params(json{{"items", {bad}}}, 1)) << "hash type";
  EXPECT_FALSE(decode->prepared_from_ec_params(json::array(), 0)) << "not an object";
}

}  // namespace
}  // namespace crescent::server
