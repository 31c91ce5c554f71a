#include "proxy/encoder_stage.h"

#include <gtest/gtest.h>

#include <set>

namespace crescent::proxy {
namespace {

TEST(FindImagePartsTest, BothFormsInOrderAcrossMessages) {
  Json body = Json::parse(R"({"model":"vl","messages":[
    {"role":"system","content":"be brief"},
    {"role":"user","content":[
      {"type":"text","text":"a"},
      {"type":"image_url","image_url":{"url":"http://i/1.png","detail":"high"}},
      {"type":"image_url","image_url":"http://i/2.png"}]},
    {"role":"assistant","content":"ok"},
    {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"}},
                              {"type":"input_audio","input_audio":{}},
                              {"type":"image_url","image_url":{"no_url":1}},
                              {"type":"image_url"}, 7]}]})");
  auto parts = find_image_parts(body);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].part["image_url"]["url"], "http://i/1.png");
  EXPECT_EQ(parts[0].part["image_url"]["detail"], "high");  // the part is kept whole
  EXPECT_EQ(parts[1].part["image_url"], "http://i/2.png");
  EXPECT_EQ(parts[2].part["image_url"]["url"], "data:image/png;base64,QUJD");
  std::set<uint64_t> keys = {parts[0].key, parts[1].key, parts[2].key};
  EXPECT_EQ(keys.size(), 3u);

  EXPECT_TRUE(find_image_parts(Json::parse(R"({"prompt":"x"})")).empty());
  EXPECT_TRUE(find_image_parts(Json::parse(R"({"messages":"x"})")).empty());
  EXPECT_TRUE(
      find_image_parts(Json::parse(R"({"messages":[{"role":"user","content":"hi"}]})")).empty());
}

TEST(FindImagePartsTest, KeysFollowTheImageNotItsSpelling) {
  auto key = [](const std::string& url) {
    Json body = {
        {"messages",
         Json::array(
             {Json{{"role", "user"},
                   {"content", Json::array({Json{{"type", "image_url"}, {"image_url", url}}})}}})}};
    return find_image_parts(body).at(0).key;
  };
  EXPECT_EQ(key("data:image/png;base64,QUJD"), key("data:image/jpeg;base64,QUJD"));
  EXPECT_NE(key("data:image/png;base64,QUJD"), key("data:image/png;base64,QUJE"));
  EXPECT_EQ(key("http://i/1.png"), key("http://i/1.png"));
  EXPECT_NE(key("http://i/1.png"), key("http://i/2.png"));
}

TEST(EncoderBodyTest, OneImageOneTokenNotStreamed) {
  Json client = Json::parse(
      R"({"model":"vl","messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":99,
          "temperature":0.3})");
  Json part = {{"type", "image_url"}, {"image_url", Json{{"url", "http://i/1.png"}}}};
  EXPECT_EQ(
      encoder_body(client, part),
      R"({"model":"vl","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://i/1.png"}}]}],"max_tokens":1,"stream":false})");
  EXPECT_EQ(Json::parse(encoder_body(Json::object(), part)).contains("model"), false);
}

TEST(ParseEncoderItemsTest, ItemsOrAReason) {
  auto items = parse_encoder_items(
      R"({"id":"c","ec_transfer_params":{"items":[{"mm_hash":"a","addr":"x"},{"mm_hash":"b"}]}})");
  ASSERT_TRUE(items.is_ok()) << items.status().to_string();
  ASSERT_EQ(items->size(), 2u);
  EXPECT_EQ((*items)[0], Json::parse(R"({"mm_hash":"a","addr":"x"})"));
  EXPECT_EQ((*items)[1]["mm_hash"], "b");
  for (const char* bad :
       {"", "[1]", R"({"choices":[]})", R"({"ec_transfer_params":[]})",
        R"({"ec_transfer_params":{"items":[]}})", R"({"ec_transfer_params":{"items":{}}})",
        R"({"ec_transfer_params":{"items":[{"mm_hash":1}]}})",
        R"({"ec_transfer_params":{"items":[{"mm_hash":"a"},"b"]}})"}) {
    auto r = parse_encoder_items(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(EncoderRouterTest, RoundRobinForNewImagesAffinityForSeenOnes) {
  EncoderRouter router(3, 100);
  EXPECT_EQ(router.pick(10).encoder_index, 0);
  EXPECT_EQ(router.pick(11).encoder_index, 1);
  auto again = router.pick(10);
  EXPECT_EQ(again.encoder_index, 0);
  EXPECT_TRUE(again.is_affinity);
  EXPECT_FALSE(router.pick(12).is_affinity);  // encoder 2
  EXPECT_EQ(router.pick(13).encoder_index, 0);
  EXPECT_EQ(router.pick(11).encoder_index, 1);
  // A failed encoder is forgotten for that image only.
  router.forget(11, 2);  // not its encoder: kept
  EXPECT_TRUE(router.pick(11).is_affinity);
  router.forget(11, 1);
  auto fresh = router.pick(11);
  EXPECT_FALSE(fresh.is_affinity);
  EXPECT_EQ(fresh.encoder_index, 1);  // next in round-robin
}

TEST(EncoderRouterTest, BoundedLeastRecentlyUsed) {
  EncoderRouter router(2, 3);
  router.pick(1);  // e0
  router.pick(2);  // e1
  router.pick(3);  // e0
  router.pick(1);  // touched: 2 is now the oldest
  router.pick(4);  // e1; evicts 2
  EXPECT_EQ(router.size(), 3u);
  EXPECT_TRUE(router.pick(1).is_affinity);
  EXPECT_TRUE(router.pick(3).is_affinity);
  EXPECT_FALSE(router.pick(2).is_affinity);
  EXPECT_EQ(router.size(), 3u);
  EncoderRouter none(2, 0);
  none.pick(1);
  EXPECT_FALSE(none.pick(1).is_affinity);
}

}  // namespace
}  // namespace crescent::proxy
