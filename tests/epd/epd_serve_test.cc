// EPD with real `crescent serve` processes on the tiny Qwen2-VL model, over 127.0.0.1: an
// encoder (--role encode) answers ec_transfer_params; a --role both server given them pulls the
// embeddings instead of encoding and answers exactly what a colocated server answers without
// them; used, expired and garbage params fall back or are refused as specified; the encoder
// refuses text and completions, and answers 503 when its pool is full; a decode server loads
// no vision tower; and 1E1P1D through `crescent proxy --encode` equals colocated serving.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/base64.h"
#include "epd/epd_test_util.h"
#include "proxy/proxy_process.h"
#include "server/serve_process.h"

namespace crescent::testing {
namespace {

namespace fs = std::filesystem;

// Gradient PNGs drawn by Pillow (python3-pil, installed by scripts/setup.sh), as data URLs.
struct Images {
  Images() {
    dir = fs::temp_directory_path() / ("crescent_epd_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string script =
        "import sys\n"
        "from PIL import Image\n"
        "for name, w, h, s in [('a', 64, 64, 1), ('b', 128, 128, 2), ('c', 96, 40, 3),\n"
        "                      ('d', 128, 128, 4), ('e', 128, 128, 5)]:\n"
        "    im = Image.new('RGB', (w, h))\n"
        "    im.putdata([((x * 7 + s * 50) % 256, (y * 5 + s * 30) % 256, (x * y + s) % 256)"
        " for y in range(h) for x in range(w)])\n"
        "    im.save(sys.argv[1] + '/' + name + '.png')\n";
    const std::string script_path = (dir / "make.py").string();
    std::ofstream(script_path) << script;
    const int rc = std::system(("/usr/bin/python3 " + script_path + " " + dir.string()).c_str());
    EXPECT_EQ(rc, 0) << "python3 with Pillow is needed (scripts/setup.sh installs it)";
  }
  ~Images() { fs::remove_all(dir); }
  std::string data_url(const std::string& name) const {
    std::ifstream in(dir / (name + ".png"), std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return "data:image/png;base64," + base64_encode(s.str());
  }
  fs::path dir;
};

json chat_body(const Images& images, const std::vector<std::string>& names,
               const std::string& text = "Describe these.") {
  std::vector<std::string> urls;
  for (const std::string& name : names) {
    urls.push_back(images.data_url(name));
  }
  return chat_body_of_urls(urls, text);
}

Reply post(int port, const json& body, const std::string& path = "/v1/chat/completions") {
  Reply r = post_json(port, body, path);
  EXPECT_NE(r.status, 0) << r.error;
  return r;
}

std::string get(int port, const std::string& path, int* status = nullptr) {
  return http_get(port, path, status);
}

class EpdServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    images_ = new Images();
    encoder_ = new ServeProcess(model_args({"--role", "encode"}));
    prefill_ = new ServeProcess(model_args({"--role", "both"}));
    colocated_ = new ServeProcess(model_args({"--role", "both", "--ec-role", "consumer"}));
  }
  static void TearDownTestSuite() {
    delete colocated_;
    delete prefill_;
    delete encoder_;
    delete images_;
  }
  static Images* images_;
  static ServeProcess* encoder_;
  static ServeProcess* prefill_;  // given ec_transfer_params
  static ServeProcess* colocated_;
};

Images* EpdServeTest::images_ = nullptr;
ServeProcess* EpdServeTest::encoder_ = nullptr;
ServeProcess* EpdServeTest::prefill_ = nullptr;
ServeProcess* EpdServeTest::colocated_ = nullptr;

TEST_F(EpdServeTest, EncoderAnswersEcTransferParamsPerImageInOrder) {
  Reply r = post(encoder_->port(), chat_body(*images_, {"a", "b"}));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["object"], "chat.completion");
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  const json& items = r.body["ec_transfer_params"]["items"];
  ASSERT_EQ(items.size(), 2u) << r.body.dump();
  int64_t num_tokens = 0;
  for (const json& item : items) {
    EXPECT_EQ(item["dtype"], "float32");
    EXPECT_EQ(item["shape"].size(), 2u);
    EXPECT_GT(item["reservation_id"].get<uint64_t>(), 0u);
    EXPECT_EQ(item["num_bytes"].get<int64_t>(),
              item["shape"][0].get<int64_t>() * item["shape"][1].get<int64_t>() * 4);
    num_tokens += item["shape"][0].get<int64_t>();
  }
  EXPECT_NE(items[0]["mm_hash"], items[1]["mm_hash"]);
  // 64x64 -> 2x2 merged patches; 128x128 -> 5x5.
  EXPECT_EQ(items[0]["shape"][0], 4);
  EXPECT_EQ(items[1]["shape"][0], 25);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], num_tokens);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 0);
  // Never pulled: given back when they expire; nothing else needs them.
}

TEST_F(EpdServeTest, PulledEmbeddingsGiveTheColocatedAnswer) {
  const double encoded_before = metric(prefill_->port(), "crescent_encoder_images_total");
  const double pulled_before = metric(prefill_->port(), "crescent_ec_images_pulled_total");
  for (const auto& names : std::vector<std::vector<std::string>>{{"a", "b"}, {"c"}, {"b", "c"}}) {
    json body = chat_body(*images_, names);
    Reply e = post(encoder_->port(), body);
    ASSERT_EQ(e.status, 200) << e.body.dump();
    Reply want = post(colocated_->port(), body);
    body["ec_transfer_params"] = e.body["ec_transfer_params"];
    Reply got = post(prefill_->port(), body);
    expect_same_answer(got, want, "images " + json(names).dump());
  }
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_images_pulled_total") - pulled_before, 5);
  EXPECT_EQ(metric(prefill_->port(), "crescent_encoder_images_total"), encoded_before)
      << "pulled images must not be encoded again";
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_fallback_local_total"), 0);
  EXPECT_GE(metric(encoder_->port(), "crescent_ec_producer_pulls_total"), 5);

  // The answers depend on the pulled embeddings: another image answers differently.
  Reply a = post(colocated_->port(), chat_body(*images_, {"a"}));
  Reply b = post(colocated_->port(), chat_body(*images_, {"d"}));
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(b.status, 200);
  EXPECT_NE(a.body["choices"][0]["logprobs"].dump(), b.body["choices"][0]["logprobs"].dump());
}

TEST_F(EpdServeTest, UsedOrUnmatchedParamsFallBackAndGarbageIsRefused) {
  json body = chat_body(*images_, {"a", "c"});
  Reply e = post(encoder_->port(), body);
  ASSERT_EQ(e.status, 200) << e.body.dump();
  Reply want = post(colocated_->port(), body);
  body["ec_transfer_params"] = e.body["ec_transfer_params"];
  expect_same_answer(post(prefill_->port(), body), want, "first use");
  // The reservations were released by the first pull, but the entries are still cached in the
  // encoder's pool under their stamps: on shm P copies them again from the mapped pool (the
  // stamp proves the bytes); without the stamps the encoder refuses the released reservations
  // and P falls back to local encoding.
  const double fallback_before = metric(prefill_->port(), "crescent_ec_fallback_local_total");
  const double mapped_before = metric(prefill_->port(), "crescent_ec_consumer_mapped_copies_total");
  expect_same_answer(post(prefill_->port(), body), want, "second use");
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_fallback_local_total") - fallback_before, 0);
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_consumer_mapped_copies_total") - mapped_before,
            2);
  for (json& item : body["ec_transfer_params"]["items"]) {
    item.erase("stamp");
  }
  expect_same_answer(post(prefill_->port(), body), want, "second use without stamps");
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_fallback_local_total") - fallback_before, 2);

  // Items that match no image of the request are released at once.
  const double unused_before = metric(prefill_->port(), "crescent_ec_items_unused_total");
  Reply e2 = post(encoder_->port(), chat_body(*images_, {"d"}));
  ASSERT_EQ(e2.status, 200);
  json other = chat_body(*images_, {"a"});
  other["ec_transfer_params"] = e2.body["ec_transfer_params"];
  expect_same_answer(post(prefill_->port(), other),
                     post(colocated_->port(), chat_body(*images_, {"a"})), "unmatched item");
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_items_unused_total") - unused_before, 1);

  for (const json& garbage :
       {json("nope"), json{{"items", 3}}, json{{"items", json::array({{{"mm_hash", 1}}})}}}) {
    json bad = chat_body(*images_, {"a"});
    bad["ec_transfer_params"] = garbage;
    Reply r = post(prefill_->port(), bad);
    EXPECT_EQ(r.status, 400) << garbage.dump();
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find("ec_transfer_params"),
              std::string::npos)
        << r.body.dump();
  }
}

// The proxy's --prefill-images ref: P gets "ec://MM_HASH" instead of each image, pulls the
// encoder's outputs as always, and without pixels cannot fall back when a pull fails.
TEST_F(EpdServeTest, EcReferencesInsteadOfImagesArePulledOrFailWithoutFallback) {
  json body = chat_body(*images_, {"a", "c"});
  Reply e = post(encoder_->port(), body);
  ASSERT_EQ(e.status, 200) << e.body.dump();
  Reply want = post(colocated_->port(), body);
  json refs = body;
  refs["ec_transfer_params"] = e.body["ec_transfer_params"];
  json& parts = refs["messages"][0]["content"];
  size_t image = 0;
  for (json& part : parts) {
    if (part["type"] == "image_url") {
      part["image_url"]["url"] =
          "ec://" + refs["ec_transfer_params"]["items"][image++]["mm_hash"].get<std::string>();
    }
  }
  ASSERT_EQ(image, 2u);
  const double encoded_before = metric(prefill_->port(), "crescent_encoder_images_total");
  const double pulled_before = metric(prefill_->port(), "crescent_ec_images_pulled_total");
  expect_same_answer(post(prefill_->port(), refs), want, "ec:// references");
  EXPECT_EQ(metric(prefill_->port(), "crescent_ec_images_pulled_total") - pulled_before, 2);
  EXPECT_EQ(metric(prefill_->port(), "crescent_encoder_images_total"), encoded_before);

  // Released and without stamps, the pull fails; there are no pixels to encode instead.
  for (json& item : refs["ec_transfer_params"]["items"]) {
    item.erase("stamp");
  }
  Reply failed = post(prefill_->port(), refs);
  EXPECT_EQ(failed.status, 502) << failed.body.dump();
  EXPECT_NE(failed.body.dump().find("ec://"), std::string::npos) << failed.body.dump();
  // References without items are no images at all.
  refs.erase("ec_transfer_params");
  Reply bare = post(prefill_->port(), refs);
  EXPECT_EQ(bare.status, 400) << bare.body.dump();
  EXPECT_NE(bare.body.dump().find("names an encoder output"), std::string::npos)
      << bare.body.dump();
  EXPECT_EQ(metric(encoder_->port(), "crescent_ec_producer_reservations"), 0);
}

TEST_F(EpdServeTest, ExpiredParamsFallBackOrFailWithoutFallback) {
  ServeProcess quick(model_args({"--role", "encode", "--ec-reservation-timeout-s", "0.2"}));
  ServeProcess strict(model_args({"--role", "both", "--no-ec-fallback-local"}));
  json body = chat_body(*images_, {"b"});
  Reply want = post(colocated_->port(), body);
  for (int i = 0; i < 2; ++i) {
    Reply e = post(quick.port(), body);
    ASSERT_EQ(e.status, 200) << e.body.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    json late = body;
    late["ec_transfer_params"] = e.body["ec_transfer_params"];
    if (i == 0) {
      expect_same_answer(post(prefill_->port(), late), want, "expired, fallback");
    } else {
      Reply r = post(strict.port(), late);
      EXPECT_EQ(r.status, 502) << r.body.dump();
      EXPECT_NE(r.body["error"]["message"].get<std::string>().find("encoder"), std::string::npos)
          << r.body.dump();
    }
  }
  EXPECT_EQ(metric(quick.port(), "crescent_ec_producer_reservations"), 0);
  // The strict server still serves.
  Reply ok = post(strict.port(), body);
  expect_same_answer(ok, want, "strict without params");
}

TEST_F(EpdServeTest, EncoderRefusesTextAndCompletionsAndServesItsEndpoints) {
  json text = {{"messages", json::array({{{"role", "user"}, {"content", "hello"}}})},
               {"max_tokens", 4}};
  Reply r = post(encoder_->port(), text);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("encoder"), std::string::npos)
      << r.body.dump();
  Reply c = post(encoder_->port(), {{"prompt", "hello"}, {"max_tokens", 4}}, "/v1/completions");
  EXPECT_EQ(c.status, 400);
  EXPECT_NE(c.body["error"]["message"].get<std::string>().find("encoder"), std::string::npos);
  json bad_image = chat_body(*images_, {});
  bad_image["messages"][0]["content"].push_back(
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}}}});
  EXPECT_EQ(post(encoder_->port(), bad_image).status, 400);
  int status = 0;
  get(encoder_->port(), "/health", &status);
  EXPECT_EQ(status, 200);
  EXPECT_NE(get(encoder_->port(), "/v1/models").find("\"vl\""), std::string::npos);
  EXPECT_GT(metric(encoder_->port(), "crescent_ec_producer_pool_bytes"), 0);
  EXPECT_GE(metric(encoder_->port(), "crescent_encoder_images_total"), 0);
  EXPECT_EQ(metric(encoder_->port(), "crescent_vision_tower_loaded"), 1);
}

TEST_F(EpdServeTest, FullPoolAnswers503AndGivesBackWhatTheRequestHeld) {
  // 16 KiB holds two 5x5-token images (6400 bytes each), not three.
  ServeProcess small(model_args({"--role", "encode", "--ec-pool-size", "16KiB"}));
  Reply r = post(small.port(), chat_body(*images_, {"b", "d", "e"}));
  EXPECT_EQ(r.status, 503) << r.body.dump();
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("pool is full"), std::string::npos)
      << r.body.dump();
  EXPECT_EQ(metric(small.port(), "crescent_ec_producer_reservations"), 0);
  EXPECT_EQ(metric(small.port(), "crescent_encoder_pool_full_total"), 1);
  // Two fit.
  EXPECT_EQ(post(small.port(), chat_body(*images_, {"b", "d"})).status, 200);
}

TEST_F(EpdServeTest, DecodeServerLoadsNoVisionTower) {
  ServeProcess decode(model_args({"--role", "decode"}));
  EXPECT_EQ(metric(decode.port(), "crescent_vision_tower_loaded"), 0);
  // The log line may reach the pipe reader after /health answered (a loaded machine).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (decode.output().find("vision tower not loaded") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(decode.output().find("vision tower not loaded"), std::string::npos) << decode.output();
}

// 1E1P1D: the proxy asks the encoder, then runs prefill/decode with ec_transfer_params.
TEST_F(EpdServeTest, ThroughTheProxyEqualsColocated) {
  const int bootstrap_port = free_port();
  ServeProcess prefill(
      model_args({"--role", "prefill", "--bootstrap-port", std::to_string(bootstrap_port)}));
  ServeProcess decode(model_args({"--role", "decode"}));
  ProxyProcess proxy({"--encode", "http://127.0.0.1:" + std::to_string(encoder_->port()),
                      "--prefill", "http://127.0.0.1:" + std::to_string(prefill.port()),
                      std::to_string(bootstrap_port), "--decode",
                      "http://127.0.0.1:" + std::to_string(decode.port())});
  wait_until_healthy(proxy.port(), "the 1E1P1D proxy");
  const double pulled_before = metric(prefill.port(), "crescent_ec_images_pulled_total");
  int num_images = 0;
  for (const auto& names : std::vector<std::vector<std::string>>{
           {"a"}, {"b", "c"}, {"a", "b", "e"}, {"d", "d"}, {"c"}}) {
    json body = chat_body(*images_, names, "What is in " + std::to_string(names.size()) + "?");
    // D computes the last prompt token alone: float rounding moves the first token's logprobs
    // by up to ~3e-4 against colocated serving (epd_correctness_test compares with 1P1D).
    expect_same_tokens(post(proxy.port(), body), post(colocated_->port(), body),
                       "proxy, images " + json(names).dump(), /*tolerance=*/1e-3);
    num_images += static_cast<int>(names.size());
  }
  EXPECT_GT(metric(prefill.port(), "crescent_ec_images_pulled_total") - pulled_before, 0);
  EXPECT_EQ(metric(prefill.port(), "crescent_encoder_images_total"), 0)
      << "every image should have come from the encoder";
  EXPECT_EQ(metric(decode.port(), "crescent_vision_tower_loaded"), 0);
  // D took every image's mm_hash and grid from the proxy's items, decoding none.
  EXPECT_EQ(metric(decode.port(), "crescent_ec_images_described_total"), num_images);
}

}  // namespace
}  // namespace crescent::testing
