// `crescent proxy` as a real process, against fake prefill, bootstrap and decode servers that
// run in the test process (127.0.0.1).

#include "proxy/proxy_process.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "net/http/http_client.h"
#include "proxy/fake_upstreams.h"
#include "tests/testing/health_poll.h"

namespace crescent::testing {
namespace {

using proxy::testing::FakeServer;
using proxy::testing::Gate;

constexpr int64_t kWaitMs = 20'000;

// Polls the proxy's /health until 200: it answers 503 "not polled yet" until it has polled its
// upstreams once, which on a loaded machine can come after its port is open.
::testing::AssertionResult becomes_healthy(ProxyProcess& proxy) {
  const HealthAnswer health = poll_health(proxy.port(), 200, Deadline::after_ms(kWaitMs));
  if (health.status == 200) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "the proxy never became ready (last /health: " << health.status << " " << health.body
         << "):\n"
         << proxy.output();
}

TEST(ProxyProcessTest, UsageErrorsExitWithCode2AndAMessage) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{}, "--prefill"},
           {{"--prefill", "http://127.0.0.1:8010"}, "--decode"},
           {{"--decode", "http://127.0.0.1:8020"}, "--prefill"},
           {{"--prefill", "127.0.0.1:8010", "--decode", "http://127.0.0.1:8020"}, "http://"},
           {{"--prefill", "http://127.0.0.1:8010", "port", "--decode", "http://127.0.0.1:8020"},
            "'port'"},
           {{"--prefill", "http://127.0.0.1:8010", "--decode", "http://127.0.0.1:99999"}, "99999"},
           {{"--prefill", "http://127.0.0.1:8010", "--decode", "http://127.0.0.1:8020", "--port",
             "x"},
            "--port"},
           {{"--pd", "http://127.0.0.1:8000", "--decode", "http://127.0.0.1:8020"}, "--pd"},
       }) {
    ExitResult r = run_proxy_to_exit(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
    EXPECT_NE(r.output.find("usage: crescent proxy"), std::string::npos) << r.output;
  }
}

TEST(ProxyProcessTest, HelpExplainsTheFlow) {
  ExitResult r = run_proxy_to_exit({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* text : {"--prefill URL", "--decode URL", "kv_transfer_params",
                           "remote_bootstrap_addr", "X-data-parallel-rank", "/query"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text;
  }
}

TEST(ProxyProcessTest, HelpExplainsTheEncoderStage) {
  ExitResult r = run_proxy_to_exit({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* text :
       {"--encode URL", "--encode-timeout-s", "--pd URL", "ec_transfer_params", "1E1PD"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text;
  }
}

// 1E1PD as a process: an encoder and a colocated prefill+decode server, both fakes.
TEST(ProxyProcessTest, EncoderThenColocatedPrefillDecode) {
  FakeServer encoder(proxy::testing::encoder_handler("e0"));
  FakeServer pd([](auto&&...) {});
  pd.set_handler(proxy::testing::decode_handler(&pd));
  ProxyProcess proxy({"--encode", encoder.url(), "--pd", pd.url(), "--encode-timeout-s", "5"});
  EXPECT_NE(proxy.output().find("(1 pd, 1 encode)"), std::string::npos) << proxy.output();
  ASSERT_TRUE(becomes_healthy(proxy));
  net::http::HttpClient client("127.0.0.1", proxy.port());
  std::string body =
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},)"
      R"({"type":"image_url","image_url":{"url":"http://i/a.png"}}]}]})";
  auto r = client.request("POST", "/v1/chat/completions", body,
                          {{"Content-Type", "application/json"}}, Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->status, 200) << r->body;
  ASSERT_EQ(encoder.requests_to("/v1/chat/completions").size(), 1u);
  auto got = pd.requests_to("/v1/chat/completions");
  ASSERT_EQ(got.size(), 1u);
  auto sent = nlohmann::json::parse(got[0].body);
  EXPECT_EQ(sent["ec_transfer_params"]["items"][0]["mm_hash"],
            proxy::testing::fake_mm_hash("http://i/a.png"));
  EXPECT_FALSE(sent.contains("kv_transfer_params"));
  // A full pool: 503 naming the encoder, and the pd server is not called.
  encoder.set_handler([](const net::http::Request&, auto w) {
    w->send(503, "application/json", R"({"error":{"message":"pool full","code":503}})");
  });
  r = client.request("POST", "/v1/chat/completions", body, {{"Content-Type", "application/json"}},
                     Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("encoder " + encoder.url()), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("pool full"), std::string::npos) << r->body;
  EXPECT_EQ(pd.requests_to("/v1/chat/completions").size(), 1u);
  EXPECT_EQ(proxy.terminate(), 0) << proxy.output();
}

TEST(ProxyProcessTest, AddressInUseIsAnErrorAtStart) {
  FakeServer taken([](const net::http::Request&, auto w) { w->send(200, "text/plain", ""); });
  ExitResult r = run_proxy_to_exit({"--port", std::to_string(taken.port()), "--prefill",
                                    "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot listen"), std::string::npos) << r.output;
}

// One prefill (dp 2) with its bootstrap server and two decode servers, all fakes.
class ProxyProcessFlowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    decode_a_.set_handler(proxy::testing::decode_handler(&decode_a_, 3, 20));
    decode_b_.set_handler(proxy::testing::decode_handler(&decode_b_, 3, 20));
    proxy_ = std::make_unique<ProxyProcess>(std::vector<std::string>{
        "--prefill", prefill_.url(), std::to_string(bootstrap_.port()), "--decode", decode_a_.url(),
        "--decode", decode_b_.url(), "--request-timeout", "20"});
    ASSERT_TRUE(becomes_healthy(*proxy_));
  }

  // Streams a chat completion; returns the SSE payloads.
  std::vector<std::string> stream_chat(const std::string& request_id) {
    net::http::HttpClient client("127.0.0.1", proxy_->port());
    net::http::SseParser sse;
    std::vector<std::string> events;
    std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})";
    auto r = client.stream(
        "POST", "/v1/chat/completions", body,
        {{"Content-Type", "application/json"}, {"X-Request-Id", request_id}},
        [&](std::string_view data) {
          sse.feed(data, [&](std::string_view e) { events.emplace_back(e); });
          return true;
        },
        Deadline::after_ms(kWaitMs));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (r.is_ok()) {
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->header("content-type"), "text/event-stream");
    }
    return events;
  }

  FakeServer prefill_{proxy::testing::prefill_handler()};
  FakeServer bootstrap_{proxy::testing::bootstrap_handler({"engine-r0", "engine-r1"})};
  FakeServer decode_a_{[](auto&&...) {}};
  FakeServer decode_b_{[](auto&&...) {}};
  std::unique_ptr<ProxyProcess> proxy_;
};

TEST_F(ProxyProcessFlowTest, StreamsThroughPrefillAndDecode) {
  for (int i = 0; i < 4; ++i) {
    auto events = stream_chat("proc-" + std::to_string(i));
    ASSERT_EQ(events.size(), 4u);
    EXPECT_EQ(events.back(), "[DONE]");
  }
  ASSERT_TRUE(prefill_.wait_for_requests("/v1/chat/completions", 4, kWaitMs));
  // Round-robin: ranks 0,1,0,1 on the prefill; decode servers a,b,a,b.
  auto p = prefill_.requests_to("/v1/chat/completions");
  auto a = decode_a_.requests_to("/v1/chat/completions");
  auto b = decode_b_.requests_to("/v1/chat/completions");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (const auto& r : p) {
    int n = r.header("x-request-id").back() - '0';
    EXPECT_EQ(r.header("x-data-parallel-rank"), std::to_string(n % 2));
    auto body = nlohmann::json::parse(r.body);
    EXPECT_EQ(body["max_tokens"], 1);
    EXPECT_EQ(body["stream"], false);
  }
  for (const auto& r : a) {
    auto kv = nlohmann::json::parse(r.body)["kv_transfer_params"];
    EXPECT_EQ(kv["remote_engine_id"], "engine-r0");
    EXPECT_EQ(kv["remote_bootstrap_addr"], "http://127.0.0.1:" + std::to_string(bootstrap_.port()));
    EXPECT_EQ(kv["transfer_id"], "xfer-" + r.header("x-request-id"));
  }
  net::http::HttpClient client("127.0.0.1", proxy_->port());
  auto m = client.request("GET", "/metrics", "", {}, Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(m.is_ok());
  EXPECT_NE(
      m->body.find("crescent_proxy_requests_total{endpoint=\"chat_completions\",outcome=\"ok\"} 4"),
      std::string::npos)
      << m->body;
  EXPECT_EQ(proxy_->terminate(), 0) << proxy_->output();
  EXPECT_NE(proxy_->output().find("stopped (0 request(s) cut off)"), std::string::npos);
}

TEST_F(ProxyProcessFlowTest, SigtermLetsARequestInFlightFinish) {
  decode_a_.set_handler(proxy::testing::decode_handler(&decode_a_, 5, 100));
  std::vector<std::string> events;
  std::thread client([&] { events = stream_chat("drain-0"); });
  ASSERT_TRUE(decode_a_.wait_for_requests("/v1/chat/completions", 1, kWaitMs));
  EXPECT_EQ(proxy_->terminate(), 0) << proxy_->output();
  client.join();
  ASSERT_EQ(events.size(), 6u) << proxy_->output();
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_NE(proxy_->output().find("draining 1 request(s)"), std::string::npos) << proxy_->output();
}

TEST_F(ProxyProcessFlowTest, ClientThatLeavesClosesTheDecodeConnection) {
  auto closed = std::make_shared<Gate>();
  decode_a_.set_handler([closed](const net::http::Request&, auto w) {
    w->on_close([closed] { closed->open(); });
    w->start_stream(200, "text/event-stream");
    w->write("data: {\"n\":1}\n\n");
  });
  net::http::HttpClient client("127.0.0.1", proxy_->port());
  auto r = client.stream(
      "POST", "/v1/completions", R"({"prompt":"a","stream":true})",
      {{"Content-Type", "application/json"}}, [](std::string_view) { return false; },
      Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(closed->wait(kWaitMs));
}

}  // namespace
}  // namespace crescent::testing
