#include "epd/epd_test_util.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <sstream>
#include <thread>

#include "core/base64.h"
#include "media/encode.h"
#include "net/http/http_client.h"
#include "testing/test_models.h"
#include "tests/testing/free_port.h"
#include "tests/testing/health_poll.h"

namespace crescent::testing {

using net::http::HttpClient;

namespace {

media::RgbImage picture(int width, int height, int seed) {
  media::RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width) * height * 3);
  size_t i = 0;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.rgb[i++] = static_cast<uint8_t>((x * 7 + seed * 50) % 256);
      image.rgb[i++] = static_cast<uint8_t>((y * 5 + seed * 30) % 256);
      image.rgb[i++] = static_cast<uint8_t>((x * y + seed * 13) % 256);
    }
  }
  return image;
}

std::string data_url(const std::string& mime, const std::vector<uint8_t>& bytes) {
  return "data:" + mime + ";base64," + base64_encode(bytes);
}

}  // namespace

std::string png_data_url(int width, int height, int seed, int png_level) {
  media::PngEncodeOptions options;
  options.compression_level = png_level;
  auto bytes = media::encode_png(picture(width, height, seed), options);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? data_url("image/png", *bytes) : "";
}

std::string jpeg_data_url(int width, int height, int seed) {
  auto bytes = media::encode_jpeg(picture(width, height, seed), 90);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? data_url("image/jpeg", *bytes) : "";
}

json chat_body_of_urls(const std::vector<std::string>& urls, const std::string& text,
                       int max_tokens) {
  json content = json::array({{{"type", "text"}, {"text", text}}});
  for (const std::string& url : urls) {
    content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
  }
  return {{"model", "vl"},
          {"messages", json::array({{{"role", "user"}, {"content", std::move(content)}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"logprobs", true},
          {"top_logprobs", 3}};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Reply post_json(int port, const json& body, const std::string& path,
                std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  HttpClient client("127.0.0.1", port);
  auto r = client.request("POST", path, body.dump(), {{"Content-Type", "application/json"}},
                          Deadline::after(timeout));
  Reply reply;
  reply.seconds = seconds_since(start);
  if (!r.is_ok()) {
    reply.error = r.status().to_string();
    return reply;
  }
  reply.status = r->status;
  reply.body = json::parse(r->body, nullptr, false);
  return reply;
}

std::string http_get(int port, const std::string& path, int* status) {
  HttpClient client("127.0.0.1", port);
  auto r = client.request("GET", path, "", {}, Deadline::after_ms(30'000));
  if (status != nullptr) {
    *status = r.is_ok() ? r->status : 0;
  } else {
    EXPECT_TRUE(r.is_ok()) << "GET " << path << " on port " << port << ": "
                           << r.status().to_string();
  }
  return r.is_ok() ? r->body : "";
}

double metric(int port, const std::string& name) {
  std::istringstream lines(http_get(port, "/metrics"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  ADD_FAILURE() << name << " not in /metrics of port " << port;
  return std::nan("");
}

double wait_for_metric(int port, const std::string& name, double value,
                       std::chrono::milliseconds timeout) {
  const Deadline deadline = Deadline::after(timeout);
  double v = metric(port, name);
  while (v != value && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = metric(port, name);
  }
  return v;
}

void wait_until_healthy(int port, const std::string& what, std::chrono::milliseconds timeout) {
  const HealthAnswer health = poll_health(port, 200, Deadline::after(timeout));
  EXPECT_EQ(health.status, 200) << what << " on port " << port << " was not healthy in "
                                << timeout.count() << " ms: " << health.body;
}

std::string text_of(const Reply& r) {
  return r.body["choices"][0]["message"]["content"].get<std::string>();
}

namespace {

void expect_same(const Reply& got, const Reply& want, const std::string& what, double tolerance,
                 bool with_top_logprobs) {
  ASSERT_EQ(got.status, 200) << what << ": " << got.error << got.body.dump();
  ASSERT_EQ(want.status, 200) << what << ": " << want.error << want.body.dump();
  EXPECT_EQ(text_of(got), text_of(want)) << what;
  const json& g = got.body["choices"][0]["logprobs"]["content"];
  const json& w = want.body["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(g.is_array() && w.is_array()) << what << ": " << got.body.dump();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i]["token"], w[i]["token"]) << what << " token " << i;
    EXPECT_NEAR(g[i]["logprob"].get<double>(), w[i]["logprob"].get<double>(), tolerance)
        << what << " token " << i;
    if (!with_top_logprobs) {
      continue;
    }
    const json& gt = g[i]["top_logprobs"];
    const json& wt = w[i]["top_logprobs"];
    ASSERT_EQ(gt.size(), wt.size()) << what << " token " << i;
    EXPECT_EQ(wt.size(), 3u) << what << " token " << i;
    for (size_t k = 0; k < gt.size(); ++k) {
      EXPECT_EQ(gt[k]["token"], wt[k]["token"]) << what << " token " << i << " top " << k;
      EXPECT_NEAR(gt[k]["logprob"].get<double>(), wt[k]["logprob"].get<double>(), tolerance)
          << what << " token " << i << " top " << k;
    }
  }
}

}  // namespace

void expect_same_answer(const Reply& got, const Reply& want, const std::string& what,
                        double tolerance) {
  expect_same(got, want, what, tolerance, /*with_top_logprobs=*/true);
}

void expect_same_tokens(const Reply& got, const Reply& want, const std::string& what,
                        double tolerance) {
  expect_same(got, want, what, tolerance, /*with_top_logprobs=*/false);
}

int free_port() {
  return pick_free_port();
}

std::string url_of(int port) {
  return "http://127.0.0.1:" + std::to_string(port);
}

std::vector<std::string> model_args(std::vector<std::string> more) {
  std::vector<std::string> args = {
      "--model", ensure_test_model("tiny-qwen2-vl"), "--served-model-name", "vl", "--threads", "2"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace crescent::testing
