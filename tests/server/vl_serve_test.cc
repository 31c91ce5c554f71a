// `crescent serve` on the tiny Qwen2-VL model, over 127.0.0.1: image chats whole and streamed,
// several images, the encoder cache seen through /metrics, the URL rules (data:, file:// under
// --allowed-local-media-path, http:// refused), bad images refused with a 400 that says why
// while the server keeps serving, a text-only model refusing images, and the official openai
// npm client.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/base64.h"
#include "net/http/http_client.h"
#include "server/serve_process.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;
namespace fs = std::filesystem;

Deadline soon() {
  return Deadline::after_ms(90'000);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Test images drawn by Pillow (python3-pil, installed by scripts/setup.sh): a gradient of the
// given size and seed, saved as PNG.
struct Images {
  Images() {
    dir = fs::temp_directory_path() / ("crescent_vl_serve_" + std::to_string(::getpid()));
    fs::create_directories(dir / "allowed");
    const std::string script =
        "import sys\n"
        "from PIL import Image\n"
        "for name, w, h, s in [('a', 64, 64, 1), ('b', 128, 128, 2), ('c', 96, 40, 3)]:\n"
        "    im = Image.new('RGB', (w, h))\n"
        "    im.putdata([((x * 7 + s * 50) % 256, (y * 5 + s * 30) % 256, (x * y + s) % 256)"
        " for y in range(h) for x in range(w)])\n"
        "    im.save(sys.argv[1] + '/allowed/' + name + '.png')\n"
        "open(sys.argv[1] + '/outside.png', 'wb').write(open(sys.argv[1] + '/allowed/a.png',"
        " 'rb').read())\n";
    const std::string script_path = (dir / "make.py").string();
    std::ofstream(script_path) << script;
    const int rc = std::system(("/usr/bin/python3 " + script_path + " " + dir.string()).c_str());
    EXPECT_EQ(rc, 0) << "python3 with Pillow is needed (scripts/setup.sh installs it)";
  }
  ~Images() { fs::remove_all(dir); }
  std::string png(const std::string& name) const {
    return (dir / "allowed" / (name + ".png")).string();
  }
  std::string data_url(const std::string& name) const {
    return "data:image/png;base64," + base64_encode(read_file(png(name)));
  }
  fs::path dir;
};

json image_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

json chat_body(json content, int max_tokens = 6) {
  return {{"messages", json::array({{{"role", "user"}, {"content", std::move(content)}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

struct Reply {
  int status = 0;
  json body;
};

Reply post(HttpClient& client, const json& body) {
  auto r = client.request("POST", "/v1/chat/completions", body.dump(),
                          {{"Content-Type", "application/json"}}, soon());
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) {
    return {};
  }
  return {r->status, json::parse(r->body, nullptr, false)};
}

double metric(HttpClient& client, const std::string& name) {
  auto r = client.request("GET", "/metrics", "", {}, soon());
  EXPECT_TRUE(r.is_ok());
  std::istringstream lines(r->body);
  std::string line;
  while (std::getline(lines, line)) {
    // Either "name value" or "name{labels} value".
    if (line.rfind(name + " ", 0) == 0 || line.rfind(name + "{", 0) == 0) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  ADD_FAILURE() << name << " not in /metrics";
  return -1;
}

class VlServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    images_ = new Images();
    server_ =
        new ServeProcess({"--model", ensure_test_model("tiny-qwen2-vl"), "--served-model-name",
                          "tiny-vl", "--threads", "1", "--max-model-len", "1024", "--kv-cache-mb",
                          "64", "--allowed-local-media-path", (images_->dir / "allowed").string(),
                          "--limit-mm-per-prompt", "image=3"});
  }
  static void TearDownTestSuite() {
    delete server_;
    delete images_;
  }
  HttpClient client() { return HttpClient("127.0.0.1", server_->port()); }
  static Images* images_;
  static ServeProcess* server_;
};
Images* VlServeTest::images_ = nullptr;
ServeProcess* VlServeTest::server_ = nullptr;

TEST_F(VlServeTest, ImageChatCountsOnePlaceholderPerMergedPatch) {
  HttpClient c = client();
  const json text = {{"type", "text"}, {"text", "What is in the picture?"}};
  Reply a = post(c, chat_body({image_part(images_->data_url("a")), text}));
  Reply b = post(c, chat_body({image_part(images_->data_url("b")), text}));
  ASSERT_EQ(a.status, 200) << a.body.dump();
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_EQ(a.body["usage"]["completion_tokens"], 6);
  // 64x64 -> smart_resize 56x56 -> 4x4 patches -> 2x2 = 4 tokens; 128x128 -> 140x140 -> 10x10
  // patches -> 5x5 = 25 tokens.
  EXPECT_EQ(
      b.body["usage"]["prompt_tokens"].get<int>() - a.body["usage"]["prompt_tokens"].get<int>(),
      25 - 4);
}

TEST_F(VlServeTest, StreamedEqualsWholeAndSeveralImagesWork) {
  HttpClient c = client();
  json body = chat_body({image_part(images_->data_url("c")),
                         {{"type", "text"}, {"text", "and"}},
                         image_part(images_->data_url("b"))},
                        8);
  Reply whole = post(c, body);
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  body["stream"] = true;
  std::string streamed;
  net::http::SseParser sse;
  auto r = c.stream(
      "POST", "/v1/chat/completions", body.dump(), {{"Content-Type", "application/json"}},
      [&](std::string_view d) {
        sse.feed(d, [&](std::string_view e) {
          if (e == "[DONE]") {
            return;
          }
          json j = json::parse(e);
          if (!j["choices"].empty() && j["choices"][0]["delta"].contains("content")) {
            streamed += j["choices"][0]["delta"]["content"].get<std::string>();
          }
        });
        return true;
      },
      soon());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(streamed, whole.body["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(VlServeTest, TheSameImageAgainSkipsTheEncoder) {
  HttpClient c = client();
  const json body =
      chat_body({image_part(images_->data_url("c")), {{"type", "text"}, {"text", "x"}}});
  ASSERT_EQ(post(c, body).status, 200);
  const double encoded = metric(c, "crescent_encoder_images_total");
  const double hits = metric(c, "crescent_encoder_cache_hits_total");
  Reply again = post(c, body);
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(metric(c, "crescent_encoder_images_total"), encoded);
  EXPECT_EQ(metric(c, "crescent_encoder_cache_hits_total"), hits + 1);
}

TEST_F(VlServeTest, UrlRulesAndBadImagesAre400AndChangeNothing) {
  HttpClient c = client();
  struct Case {
    std::string url;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"file://" + images_->png("a"), ""},  // allowed
      {"file://" + (images_->dir / "outside.png").string(), "allowed"},
      {"file://" + images_->png("nope"), ""},
      {"http://127.0.0.1:9/x.png", "--allow-remote-media"},
      {"https://example.invalid/x.png", ""},
      {"data:image/png;base64,@@@@", "base64"},
      {"data:image/png;base64," + base64_encode("this is not an image at all"),
       "PNG, JPEG or WebP"},
      {"ftp://host/x.png", ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Reply r = post(c, chat_body({image_part(cases[i].url), {{"type", "text"}, {"text", "x"}}}));
    if (i == 0) {
      EXPECT_EQ(r.status, 200) << r.body.dump();
      continue;
    }
    EXPECT_EQ(r.status, 400) << cases[i].url << ": " << r.body.dump();
    const std::string message = r.body["error"]["message"].get<std::string>();
    EXPECT_NE(message.find(cases[i].says), std::string::npos) << message;
  }
  // Too many images, an image in a completion-less role, a video part.
  const json four = {image_part(images_->data_url("a")), image_part(images_->data_url("a")),
                     image_part(images_->data_url("a")), image_part(images_->data_url("a"))};
  Reply many = post(c, chat_body(four));
  EXPECT_EQ(many.status, 400);
  EXPECT_NE(many.body.dump().find("--limit-mm-per-prompt"), std::string::npos) << many.body.dump();
  Reply video = post(c, chat_body({{{"type", "video_url"}, {"video_url", {{"url", "x"}}}}}));
  EXPECT_EQ(video.status, 400) << video.body.dump();
  // Still serving, and nothing held.
  Reply ok = post(c, chat_body({image_part(images_->data_url("a"))}));
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(metric(c, "crescent_num_requests_running"), 0);
}

TEST_F(VlServeTest, OfficialOpenAiClient) {
  const std::string node_modules =
      std::string(CRESCENT_SOURCE_DIR) + "/tools/npm/node_modules/openai";
  ASSERT_EQ(std::system(("test -d " + node_modules).c_str()), 0)
      << "tools/npm/node_modules/openai missing: run scripts/setup.sh";
  const std::string cmd = "node " + std::string(CRESCENT_SOURCE_DIR) +
                          "/tests/server/openai_vl_conformance.mjs http://127.0.0.1:" +
                          std::to_string(server_->port()) + "/v1 tiny-vl " + images_->png("a") +
                          " " + images_->png("b") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) {
    out.append(buf, n);
  }
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("openai vl conformance: ok"), std::string::npos) << out;
}

TEST(VlServeTextOnlyTest, ATextModelRefusesImages) {
  ServeProcess server({"--model", ensure_test_model("tiny"), "--threads", "1", "--max-model-len",
                       "256", "--kv-cache-mb", "16"});
  HttpClient c("127.0.0.1", server.port());
  Reply r = post(c, chat_body({image_part("data:image/png;base64,AAAA")}));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("does not take images"),
            std::string::npos)
      << r.body.dump();
}

}  // namespace
}  // namespace crescent::testing
