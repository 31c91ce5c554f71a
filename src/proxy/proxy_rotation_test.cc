// The proxy's decode rotation (upstream_health.h) in-process, against fake prefill, bootstrap
// and decode servers on real sockets: a decode server that cannot be reached is taken out of
// rotation, the proxy answers 503 without asking any prefill server while none is up, a /health
// probe brings a server back, and the prefill half is abandoned when the decode half fails.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "net/http/http_client.h"
#include "proxy/fake_upstreams.h"
#include "proxy/proxy_server.h"

namespace crescent::proxy {
namespace {

using net::http::HttpClient;
using testing::FakeServer;
using testing::Gate;
using Json = nlohmann::ordered_json;

constexpr int64_t kWaitMs = 10'000;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

template <typename Pred>
bool eventually(Pred pred) {
  auto deadline = Deadline::after_ms(kWaitMs);
  while (!pred() && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

std::unique_ptr<FakeServer> make_decode(int port = 0) {
  auto server = std::make_unique<FakeServer>([](auto&&...) {}, 4, port);
  server->set_handler(testing::decode_handler(server.get()));
  return server;
}

class ProxyRotationTest : public ::testing::Test {
 protected:
  ProxyRotationTest()
      : prefill_(testing::prefill_handler()), bootstrap_(testing::bootstrap_handler({"e0"})) {}

  // decode_urls: the decode servers, in order. With a second prefill (prefill2_, bootstrap2_).
  void start_proxy(const std::vector<std::string>& decode_urls, bool with_second_prefill = false,
                   int64_t refresh_interval_ms = 2000) {
    ProxyOptions options;
    options.port = 0;
    options.poll_interval_ms = 20;
    options.refresh_interval_ms = refresh_interval_ms;
    options.request_timeout_s = 30;
    PrefillSpec spec;
    spec.server = *parse_upstream_url(prefill_.url());
    spec.bootstrap_port = bootstrap_.port();
    options.prefills.push_back(spec);
    if (with_second_prefill) {
      spec.server = *parse_upstream_url(prefill2_.url());
      spec.bootstrap_port = bootstrap2_.port();
      options.prefills.push_back(spec);
    }
    for (const auto& url : decode_urls) {
      options.decodes.push_back(*parse_upstream_url(url));
    }
    auto proxy = ProxyServer::start(options);
    ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string();
    proxy_ = std::move(proxy).value();
    ASSERT_TRUE(eventually([&] { return proxy_->is_ready(); }));
  }

  Result<net::http::Response> post(const std::string& body = R"({"prompt":"a"})") {
    HttpClient client("127.0.0.1", proxy_->port());
    return client.request("POST", "/v1/completions", body, {{"Content-Type", "application/json"}},
                          Deadline::after_ms(kWaitMs));
  }

  Result<net::http::Response> health() {
    HttpClient client("127.0.0.1", proxy_->port());
    return client.request("GET", "/health", "", {}, Deadline::after_ms(kWaitMs));
  }
  std::string metrics() {
    HttpClient client("127.0.0.1", proxy_->port());
    auto r = client.request("GET", "/metrics", "", {}, Deadline::after_ms(kWaitMs));
    EXPECT_TRUE(r.is_ok());
    return r.is_ok() ? r->body : "";
  }

  // Sends n requests; each must succeed or fail with 502 naming `culprit`. Returns the failures.
  int num_failed_of(int n, const std::string& culprit) {
    int num_failed = 0;
    for (int i = 0; i < n; ++i) {
      auto r = post();
      EXPECT_TRUE(r.is_ok());
      if (r.is_ok() && r->status != 200) {
        ++num_failed;
        EXPECT_EQ(r->status, 502) << r->body;
        EXPECT_TRUE(contains(r->body, culprit)) << r->body;
      }
    }
    return num_failed;
  }

  size_t num_prefill_calls() const { return prefill_.requests_to("/v1/completions").size(); }

  FakeServer prefill_;
  FakeServer bootstrap_;
  FakeServer prefill2_{testing::prefill_handler()};
  FakeServer bootstrap2_{testing::bootstrap_handler({"e1"})};
  std::unique_ptr<ProxyServer> proxy_;
};

TEST_F(ProxyRotationTest, NoDecodeUpAnswers503AtOnceWithoutAskingThePrefill) {
  auto decode = make_decode();
  std::string url = decode->url();
  start_proxy({url});
  decode->stop();
  // The first request finds out: 502 naming the decode server, which leaves the rotation.
  auto first = post();
  ASSERT_TRUE(first.is_ok());
  EXPECT_EQ(first->status, 502) << first->body;
  // Its prefill half was sent at once and closed; let it land (or not) before counting.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  size_t prefill_calls = num_prefill_calls();
  EXPECT_LE(prefill_calls, 1u);
  for (int i = 0; i < 5; ++i) {
    auto start = std::chrono::steady_clock::now();
    auto r = post();
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
    Json error = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(error.contains("error")) << r->body;
    std::string message = error["error"]["message"];
    EXPECT_TRUE(contains(message, "no decode server is up")) << message;
    EXPECT_TRUE(contains(message, url)) << message;
    EXPECT_TRUE(error["error"].contains("type") && error["error"].contains("code")) << r->body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(num_prefill_calls(), prefill_calls) << "a prefill server was asked for nothing";
  // The proxy's own /health says it cannot serve, naming the decode server.
  auto h = health();
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->status, 503) << h->body;
  EXPECT_TRUE(contains(h->body, "no decode server is up")) << h->body;
  EXPECT_TRUE(contains(h->body, url)) << h->body;
  std::string m = metrics();
  EXPECT_TRUE(contains(m, "crescent_proxy_upstream_up{side=\"decode\",upstream=\"" + url + "\"} 0"))
      << m;
  EXPECT_TRUE(contains(
      m, "crescent_proxy_upstream_ejections_total{side=\"decode\",upstream=\"" + url + "\"} 1"))
      << m;
  EXPECT_TRUE(contains(
      m, "crescent_proxy_requests_total{endpoint=\"completions\",outcome=\"not_ready\"} 5"))
      << m;
}

TEST_F(ProxyRotationTest, RequestsGoAroundADeadDecodeAndBackOnceItAnswersAgain) {
  auto d0 = make_decode();
  auto d1 = make_decode();
  const int d0_port = d0->port();
  start_proxy({d0->url(), d1->url()});
  d0->stop();
  // At most one request fails (the one that finds d0 gone); every later one goes to d1.
  EXPECT_LE(num_failed_of(10, "decode " + d0->url()), 1);
  EXPECT_GE(d1->requests_to("/v1/completions").size(), 9u);
  // d0 comes back on its port: a /health probe finds it and it takes requests again.
  auto d0_again = make_decode(d0_port);
  std::string up =
      "crescent_proxy_upstream_up{side=\"decode\",upstream=\"" + d0_again->url() + "\"} 1";
  ASSERT_TRUE(eventually([&] { return contains(metrics(), up); })) << metrics();
  EXPECT_GE(d0_again->requests_to("/health").size(), 1u);
  for (int i = 0; i < 4; ++i) {
    auto r = post();
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(d0_again->requests_to("/v1/completions").size(), 2u) << "round-robin over both again";
}

TEST_F(ProxyRotationTest, PrefillHalfIsAbandonedWhenTheDecodeHalfFailsFirst) {
  auto prefill_closed = std::make_shared<Gate>();
  prefill_.set_handler(
      [prefill_closed](const net::http::Request& r, std::shared_ptr<net::http::ResponseWriter> w) {
        if (r.path == "/health") {
          return w->send(200, "application/json", "{}");
        }
        w->on_close([prefill_closed] { prefill_closed->open(); });  // never answers
      });
  // A decode server that dies without answering once the prefill holds its half.
  testing::RawServer dying([this](const net::Fd&, const std::string&) {
    prefill_.wait_for_requests("/v1/completions", 1, kWaitMs);
  });
  start_proxy({dying.url()});
  auto r = post();
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502) << r->body;
  EXPECT_TRUE(contains(r->body, dying.url())) << r->body;
  EXPECT_TRUE(prefill_closed->wait(kWaitMs)) << "the prefill request was not abandoned";
  EXPECT_TRUE(contains(
      metrics(), "crescent_proxy_upstream_up{side=\"decode\",upstream=\"" + dying.url() + "\"} 0"));
}

TEST_F(ProxyRotationTest, RequestsGoAroundADeadPrefill) {
  auto decode = make_decode();
  start_proxy({decode->url()}, /*with_second_prefill=*/true);
  prefill_.stop();
  // A request whose prefill is refused may still succeed (the fake decode answers at once):
  // count where the prefill halves went.
  EXPECT_LE(num_failed_of(10, "prefill " + prefill_.url()), 1);
  EXPECT_TRUE(prefill2_.wait_for_requests("/v1/completions", 9, kWaitMs))
      << "requests kept going to the prefill that refuses connections: "
      << prefill2_.requests_to("/v1/completions").size() << " of 10 went to the other";
}

// A decode server that fails with 502 once the prefill holds its half: what a decode server
// does when it cannot pull the KV from its prefill.
std::unique_ptr<FakeServer> make_failing_decode(FakeServer* prefill) {
  auto server = std::make_unique<FakeServer>([](auto&&...) {}, 4);
  FakeServer* raw = server.get();
  server->set_handler([raw, prefill](const net::http::Request& r,
                                     std::shared_ptr<net::http::ResponseWriter> w) {
    if (r.path == "/health") {
      return w->send(200, "application/json", "{}");
    }
    raw->spawn([prefill, w] {
      prefill->wait_for_requests("/v1/completions", 1, kWaitMs);
      w->send(502, "application/json",
              R"({"error":{"message":"KV fetch failed: prefill engine e0 closed the connection",)"
              R"("type":"BadGatewayError","param":null,"code":502}})");
    });
  });
  return server;
}

// The prefill takes the request and never answers; /health answers 503 from then on when
// `dies` (a killed prefill, as a proxy whose decode half fails first sees it), else 200.
FakeServer::Handler stalling_prefill(bool dies) {
  auto has_request = std::make_shared<std::atomic<bool>>(false);
  return [has_request, dies](const net::http::Request& r,
                             std::shared_ptr<net::http::ResponseWriter> w) {
    if (r.path == "/health") {
      return w->send(dies && has_request->load() ? 503 : 200, "application/json", "{}");
    }
    has_request->store(true);  // never answers
  };
}

TEST_F(ProxyRotationTest, APrefillThatDiesUnderADecodeFailureLeavesTheRotationAtOnce) {
  prefill_.set_handler(stalling_prefill(/*dies=*/true));
  auto decode = make_failing_decode(&prefill_);
  // A minute between refresh polls: only the check the failed request asks for can see it.
  start_proxy({decode->url()}, false, /*refresh_interval_ms=*/60'000);
  const std::string ready = "crescent_proxy_prefill_ready{prefill=\"" + prefill_.url() + "\"} ";
  ASSERT_TRUE(contains(metrics(), ready + "1")) << metrics();
  auto start = std::chrono::steady_clock::now();
  auto r = post();
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502) << r->body;
  EXPECT_TRUE(eventually([&] { return contains(metrics(), ready + "0"); })) << metrics();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(ProxyRotationTest, AHealthyPrefillStaysInRotationAfterADecodeFailure) {
  prefill_.set_handler(stalling_prefill(/*dies=*/false));
  auto decode = make_failing_decode(&prefill_);
  start_proxy({decode->url()}, false, /*refresh_interval_ms=*/60'000);
  const size_t polls_before = prefill_.requests_to("/health").size();
  auto r = post();
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502) << r->body;
  // It was checked at once, answered, and is still in rotation.
  EXPECT_TRUE(eventually([&] { return prefill_.requests_to("/health").size() > polls_before; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(
      contains(metrics(), "crescent_proxy_prefill_ready{prefill=\"" + prefill_.url() + "\"} 1"));
}

}  // namespace
}  // namespace crescent::proxy
