// The disk EC connector with real `crescent serve` processes on the tiny Qwen2-VL model: an
// encoder (--role encode --ec-connector disk --ec-path DIR) writes each image's embeddings as
// DIR/<mm_hash>.safetensors and answers file:// items; a --role both server with the same
// flags reads them instead of encoding (no local fallback, so every answer came from the
// files) and answers what a colocated server answers, directly and through the proxy (1E1PD);
// a transfer connector's item is refused with a message naming --ec-connector; a directory
// full of reserved files answers 503. Also (the same binaries, transfer connector): an
// encoder given --bootstrap-addr registers there with role "encode", and a prefill worker
// resolves items through their bootstrap_addr.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "epd/epd_test_util.h"
#include "proxy/proxy_process.h"
#include "server/serve_process.h"

namespace crescent::testing {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("crescent_epd_disk_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> disk_args(const fs::path& dir, std::vector<std::string> more) {
  std::vector<std::string> args = {"--ec-connector", "disk", "--ec-path", dir.string()};
  args.insert(args.end(), more.begin(), more.end());
  return model_args(std::move(args));
}

class EpdDiskTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("shared"));
    encoder_ = new ServeProcess(disk_args(*dir_, {"--role", "encode"}));
    both_ = new ServeProcess(disk_args(*dir_, {"--role", "both", "--no-ec-fallback-local"}));
    colocated_ = new ServeProcess(model_args({"--role", "both"}));
  }
  static void TearDownTestSuite() {
    delete colocated_;
    delete both_;
    delete encoder_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path* dir_;
  static ServeProcess* encoder_;
  static ServeProcess* both_;  // given ec_transfer_params
  static ServeProcess* colocated_;
};

fs::path* EpdDiskTest::dir_ = nullptr;
ServeProcess* EpdDiskTest::encoder_ = nullptr;
ServeProcess* EpdDiskTest::both_ = nullptr;
ServeProcess* EpdDiskTest::colocated_ = nullptr;

// Several sizes, 1-3 images, repeats within and across prompts.
std::vector<std::vector<std::string>> prompts() {
  const std::string a = png_data_url(64, 64, 1);
  const std::string b = png_data_url(128, 128, 2);
  const std::string c = png_data_url(96, 40, 3);
  const std::string d = jpeg_data_url(112, 84, 4);
  return {{a}, {b, c}, {a, b, d}, {d, d}, {c}, {b}};
}

TEST_F(EpdDiskTest, FilesReadByPrefillGiveTheColocatedAnswer) {
  const double read_before = metric(both_->port(), "crescent_ec_images_pulled_total");
  int num_images = 0;
  int n = 0;
  for (const auto& urls : prompts()) {
    const std::string what = "prompt " + std::to_string(n++);
    json body = chat_body_of_urls(urls, "What is in " + std::to_string(urls.size()) + "?");
    Reply e = post_json(encoder_->port(), body);
    ASSERT_EQ(e.status, 200) << what << ": " << e.error << e.body.dump();
    const json& items = e.body["ec_transfer_params"]["items"];
    ASSERT_EQ(items.size(), urls.size()) << e.body.dump();
    for (const json& item : items) {
      EXPECT_EQ(item["worker_addr"], "file://" + fs::absolute(*dir_).lexically_normal().string());
      EXPECT_TRUE(fs::exists(*dir_ / (item["mm_hash"].get<std::string>() + ".safetensors")))
          << item.dump();
    }
    Reply want = post_json(colocated_->port(), body);
    body["ec_transfer_params"] = e.body["ec_transfer_params"];
    expect_same_answer(post_json(both_->port(), body), want, what);
    // An image twice in one request is read once.
    std::set<std::string> distinct;
    for (const json& item : items) {
      distinct.insert(item["mm_hash"].get<std::string>());
    }
    num_images += static_cast<int>(distinct.size());
  }
  EXPECT_EQ(metric(both_->port(), "crescent_ec_images_pulled_total") - read_before, num_images);
  EXPECT_EQ(metric(both_->port(), "crescent_encoder_images_total"), 0)
      << "every image should have come from the directory";
  EXPECT_GT(metric(encoder_->port(), "crescent_ec_producer_cache_hits_total"), 0)
      << "repeated images are written once";
  // No partial files left behind.
  for (const auto& entry : fs::directory_iterator(*dir_)) {
    EXPECT_EQ(entry.path().extension(), ".safetensors") << entry.path();
  }
}

TEST_F(EpdDiskTest, ThroughTheProxyEqualsColocated) {
  ProxyProcess proxy({"--encode", url_of(encoder_->port()), "--pd", url_of(both_->port())});
  wait_until_healthy(proxy.port(), "the 1E1PD proxy");
  int n = 0;
  for (const auto& urls : prompts()) {
    json body = chat_body_of_urls(urls, "Describe " + std::to_string(n) + ".");
    expect_same_answer(post_json(proxy.port(), body), post_json(colocated_->port(), body),
                       "proxy, prompt " + std::to_string(n));
    ++n;
  }
  EXPECT_EQ(metric(both_->port(), "crescent_encoder_images_total"), 0);
}

TEST_F(EpdDiskTest, ATransferItemIsRefusedNamingTheConnector) {
  json body = chat_body_of_urls({png_data_url(64, 64, 1)}, "Hi");
  Reply e = post_json(encoder_->port(), body);
  ASSERT_EQ(e.status, 200) << e.body.dump();
  body["ec_transfer_params"] = e.body["ec_transfer_params"];
  body["ec_transfer_params"]["items"][0]["worker_addr"] = "tcp://127.0.0.1:9";
  Reply r = post_json(both_->port(), body);
  EXPECT_EQ(r.status, 400) << r.body.dump();
  EXPECT_NE(r.body.dump().find("--ec-connector"), std::string::npos) << r.body.dump();
  // And the other way round: a transfer consumer refuses a file:// item.
  body["ec_transfer_params"] = e.body["ec_transfer_params"];
  Reply t = post_json(colocated_->port(), body);
  EXPECT_EQ(t.status, 400) << t.body.dump();
  EXPECT_NE(t.body.dump().find("--ec-connector"), std::string::npos) << t.body.dump();
}

TEST_F(EpdDiskTest, ADirectoryFullOfReservedFilesAnswers503) {
  const fs::path dir = temp_dir("small");
  {
    // 16 KiB holds two files of 5x5-token images (6400 bytes of data each), not three.
    ServeProcess small(disk_args(dir, {"--role", "encode", "--ec-pool-size", "16KiB"}));
    Reply r = post_json(small.port(),
                        chat_body_of_urls({png_data_url(128, 128, 11), png_data_url(128, 128, 12),
                                           png_data_url(128, 128, 13)},
                                          "Three"));
    EXPECT_EQ(r.status, 503) << r.body.dump();
    EXPECT_NE(r.body.dump().find("full"), std::string::npos) << r.body.dump();
    EXPECT_EQ(metric(small.port(), "crescent_ec_producer_reservations"), 0)
        << "the refused request gives back what it reserved";
    EXPECT_LE(metric(small.port(), "crescent_ec_producer_pool_used_bytes"), 16 * 1024);
  }
  fs::remove_all(dir);
}

// Not the disk connector, but the same binaries: an encoder given --bootstrap-addr registers
// there with role "encode" (apart from the dp ranks), and a prefill worker resolves an item's
// engine_id through the item's bootstrap_addr: a wrong worker_addr does not matter.
TEST(EpdBootstrap, EncoderRegistersAndPrefillResolvesIt) {
  const int bootstrap_port = free_port();
  ServeProcess prefill(
      model_args({"--role", "prefill", "--bootstrap-port", std::to_string(bootstrap_port)}));
  ServeProcess encoder(
      model_args({"--role", "encode", "--bootstrap-addr", url_of(bootstrap_port)}));
  ServeProcess both(model_args({"--role", "both", "--no-ec-fallback-local"}));
  ServeProcess colocated(model_args({"--role", "both"}));
  const json encoders = json::parse(http_get(bootstrap_port, "/query?role=encode"));
  ASSERT_EQ(encoders.size(), 1u) << encoders.dump();
  const std::string engine_id = encoders.begin().key();
  EXPECT_EQ(encoders.begin().value()["role"], "encode");
  const json ranks = json::parse(http_get(bootstrap_port, "/query"));
  ASSERT_EQ(ranks.size(), 1u) << ranks.dump();
  EXPECT_NE(ranks["0"]["engine_id"], engine_id);

  json body = chat_body_of_urls({png_data_url(64, 64, 21), png_data_url(96, 40, 22)}, "Two");
  Reply e = post_json(encoder.port(), body);
  ASSERT_EQ(e.status, 200) << e.body.dump();
  for (json& item : e.body["ec_transfer_params"]["items"]) {
    EXPECT_EQ(item["engine_id"], engine_id);
    EXPECT_EQ(item["bootstrap_addr"], url_of(bootstrap_port));
    item["worker_addr"] = "tcp://127.0.0.1:9";  // nothing there
  }
  Reply want = post_json(colocated.port(), body);
  body["ec_transfer_params"] = e.body["ec_transfer_params"];
  expect_same_answer(post_json(both.port(), body), want, "resolved through the bootstrap");
  EXPECT_EQ(metric(both.port(), "crescent_ec_consumer_resolve_failures_total"), 0);
}

TEST(EpdDiskFlags, DiskWithoutAPathIsRefused) {
  // Checked before the model loads: the process exits with the message.
  const std::string out = [] {
    std::string cmd =
        std::string(CRESCENT_BINARY_DIR) +
        "/apps/crescent serve --model /nonexistent --role encode --ec-connector disk 2>&1";
    std::string text;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) {
      return text;
    }
    char buf[512];
    while (std::fgets(buf, sizeof(buf), pipe) != nullptr) {
      text += buf;
    }
    ::pclose(pipe);
    return text;
  }();
  EXPECT_NE(out.find("--ec-path"), std::string::npos) << out;
}

}  // namespace
}  // namespace crescent::testing
