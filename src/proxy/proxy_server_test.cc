// The proxy in-process against fake prefill, bootstrap and decode servers on real sockets.

#include "proxy/proxy_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "net/http/http_client.h"
#include "proxy/fake_upstreams.h"

namespace crescent::proxy {
namespace {

using net::http::HttpClient;
using testing::FakeServer;
using testing::Gate;
using Json = nlohmann::ordered_json;

constexpr int64_t kWaitMs = 10'000;

Deadline soon() {
  return Deadline::after_ms(kWaitMs);
}

// A prefill server and its bootstrap server.
struct FakePrefill {
  explicit FakePrefill(std::vector<std::string> engine_ids)
      : server(testing::prefill_handler()), bootstrap(testing::bootstrap_handler(engine_ids)) {}
  FakeServer server;
  FakeServer bootstrap;
};

// What a client saw of one streamed response.
struct StreamResult {
  Status status;
  int http_status = 0;
  std::string content_type;
  std::string request_id;
  std::vector<std::string> events;  // SSE data payloads
  std::string body;                 // raw
};

class ProxyTest : public ::testing::Test {
 protected:
  // dp_sizes: one entry per prefill.
  void start(std::vector<int> dp_sizes, int num_decodes, bool wait_ready = true,
             std::function<void(ProxyOptions&)> tweak = {}) {
    make_fakes(std::move(dp_sizes), num_decodes);
    start_proxy(wait_ready, std::move(tweak));
  }

  void make_fakes(std::vector<int> dp_sizes, int num_decodes) {
    for (size_t p = 0; p < dp_sizes.size(); ++p) {
      std::vector<std::string> ids;
      for (int r = 0; r < dp_sizes[p]; ++r) {
        ids.push_back("engine-" + std::to_string(p) + "-" + std::to_string(r));
      }
      prefills_.push_back(std::make_unique<FakePrefill>(ids));
    }
    for (int d = 0; d < num_decodes; ++d) {
      auto server = std::make_unique<FakeServer>([](auto&&...) {});
      server->set_handler(testing::decode_handler(server.get()));
      decodes_.push_back(std::move(server));
    }
  }

  void start_proxy(bool wait_ready, std::function<void(ProxyOptions&)> tweak = {}) {
    ProxyOptions options;
    options.port = 0;
    options.poll_interval_ms = 20;
    options.request_timeout_s = 30;
    for (auto& p : prefills_) {
      PrefillSpec spec;
      spec.server = *parse_upstream_url(p->server.url());
      spec.bootstrap_port = p->bootstrap.port();
      options.prefills.push_back(spec);
    }
    for (auto& d : decodes_) {
      options.decodes.push_back(*parse_upstream_url(d->url()));
    }
    for (auto& url : decode_urls_) {
      options.decodes.push_back(*parse_upstream_url(url));
    }
    for (auto& e : encoders_) {
      options.encoders.push_back(*parse_upstream_url(e->url()));
    }
    if (tweak) {
      tweak(options);
    }
    auto proxy = ProxyServer::start(options);
    ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string();
    proxy_ = std::move(proxy).value();
    if (wait_ready) {
      wait_until_ready();
    }
  }

  void wait_until_ready() {
    auto deadline = Deadline::after_ms(kWaitMs);
    while (!proxy_->is_ready() && !deadline.is_expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(proxy_->is_ready());
  }

  Result<net::http::Response> post(const std::string& path, const std::string& body,
                                   net::http::Headers headers = {}) {
    HttpClient client("127.0.0.1", proxy_->port());
    headers["Content-Type"] = "application/json";
    return client.request("POST", path, body, headers, soon());
  }

  Result<net::http::Response> get(const std::string& path) {
    HttpClient client("127.0.0.1", proxy_->port());
    return client.request("GET", path, "", {}, soon());
  }

  // Streams one request; on_event may return false to hang up.
  StreamResult stream(const std::string& path, const std::string& body,
                      net::http::Headers headers = {},
                      std::function<bool(const std::string&)> on_event = {}) {
    StreamResult out;
    HttpClient client("127.0.0.1", proxy_->port());
    headers["Content-Type"] = "application/json";
    net::http::SseParser sse;
    bool go_on = true;
    auto r = client.stream(
        "POST", path, body, headers,
        [&](std::string_view data) {
          out.body.append(data);
          sse.feed(data, [&](std::string_view e) {
            out.events.emplace_back(e);
            if (on_event && !on_event(std::string(e))) {
              go_on = false;
            }
          });
          return go_on;
        },
        soon());
    out.status = r.status();
    if (r.is_ok()) {
      out.http_status = r->status;
      out.content_type = r->header("content-type");
      out.request_id = r->header("x-request-id");
    }
    return out;
  }

  std::string metrics() {
    auto r = get("/metrics");
    EXPECT_TRUE(r.is_ok());
    return r.is_ok() ? r->body : "";
  }

  static std::string stream_body() {
    return R"({"model":"m","prompt":"hello","max_tokens":8,"stream":true})";
  }

  std::vector<std::unique_ptr<FakePrefill>> prefills_;
  std::vector<std::unique_ptr<FakeServer>> decodes_;
  std::vector<std::string> decode_urls_;  // decode servers the test runs itself
  // Encoder servers (EPD), made before start(); encoder i answers items naming "e<i>".
  void add_encoders(int n) {
    for (int i = 0; i < n; ++i) {
      encoders_.push_back(
          std::make_unique<FakeServer>(testing::encoder_handler("e" + std::to_string(i))));
    }
  }
  std::vector<std::unique_ptr<FakeServer>> encoders_;
  std::unique_ptr<ProxyServer> proxy_;
};

Json parse(const std::string& s) {
  return Json::parse(s, nullptr, false);
}

std::vector<std::string> keys_of(const Json& j) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) {
    keys.push_back(k);
  }
  return keys;
}

TEST_F(ProxyTest, SendsPrefillAndDecodeTheirBodiesAndHeaders) {
  start({1}, 1);
  std::string client_body =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,)"
      R"("stream_options":{"include_usage":true},"max_tokens":50,"max_completion_tokens":40,)"
      R"("temperature":0.5,"kv_transfer_params":{"junk":1},"zzz":[1,2]})";
  auto result = stream("/v1/chat/completions", client_body,
                       {{"X-Request-Id", "req-1"}, {"Authorization", "Bearer secret"}});
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 200);
  EXPECT_EQ(result.content_type, "text/event-stream");
  EXPECT_EQ(result.request_id, "req-1");
  ASSERT_FALSE(result.events.empty());
  EXPECT_EQ(result.events.back(), "[DONE]");

  ASSERT_TRUE(prefills_[0]->server.wait_for_requests("/v1/chat/completions", 1, kWaitMs));
  auto p = prefills_[0]->server.requests_to("/v1/chat/completions");
  auto d = decodes_[0]->requests_to("/v1/chat/completions");
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(d.size(), 1u);

  Json client = parse(client_body);
  Json expected_p = client;
  expected_p["stream"] = false;
  expected_p["max_tokens"] = 1;
  expected_p["max_completion_tokens"] = 1;
  expected_p.erase("stream_options");
  expected_p["kv_transfer_params"] =
      Json{{"do_remote_decode", true}, {"do_remote_prefill", false}, {"transfer_id", "xfer-req-1"}};
  EXPECT_EQ(parse(p[0].body), expected_p) << p[0].body;
  EXPECT_EQ(p[0].method, "POST");
  EXPECT_EQ(p[0].header("x-request-id"), "req-1");
  EXPECT_EQ(p[0].header("x-data-parallel-rank"), "0");
  EXPECT_EQ(p[0].header("authorization"), "Bearer secret");
  EXPECT_EQ(p[0].header("content-type"), "application/json");

  Json expected_d = client;
  expected_d["kv_transfer_params"] =
      Json{{"do_remote_decode", false},
           {"do_remote_prefill", true},
           {"remote_bootstrap_addr",
            "http://127.0.0.1:" + std::to_string(prefills_[0]->bootstrap.port())},
           {"remote_engine_id", "engine-0-0"},
           {"transfer_id", "xfer-req-1"}};
  Json got_d = parse(d[0].body);
  EXPECT_EQ(got_d, expected_d) << d[0].body;
  // The client's key order is kept.
  EXPECT_EQ(keys_of(got_d), keys_of(client));
  EXPECT_EQ(d[0].header("x-request-id"), "req-1");
  EXPECT_EQ(d[0].header("authorization"), "Bearer secret");
  EXPECT_EQ(d[0].header("x-data-parallel-rank"), "");
}

TEST_F(ProxyTest, MakesAFreshRequestIdWithoutXRequestId) {
  start({1}, 1);
  for (int i = 0; i < 2; ++i) {
    auto r = post("/v1/completions", R"({"prompt":"a","max_tokens":3})");
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 200);
  }
  // The prefill answer is not awaited by the client: its request may still be on its way.
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests("/v1/completions", 2, kWaitMs));
  auto p = prefills_[0]->server.requests_to("/v1/completions");
  auto d = decodes_[0]->requests_to("/v1/completions");
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(d.size(), 2u);
  // The first request's prefill half may reach P after the second's: pair them by id.
  for (int i = 0; i < 2; ++i) {
    std::string id = d[static_cast<size_t>(i)].header("x-request-id");
    EXPECT_EQ(id.size(), 36u) << id;
    EXPECT_EQ(parse(d[static_cast<size_t>(i)].body)["kv_transfer_params"]["transfer_id"],
              "xfer-" + id);
    int num_matching = 0;
    for (const auto& prefill_request : p) {
      if (prefill_request.header("x-request-id") != id)
        continue;
      ++num_matching;
      EXPECT_EQ(parse(prefill_request.body)["kv_transfer_params"]["transfer_id"], "xfer-" + id);
    }
    EXPECT_EQ(num_matching, 1) << id;
  }
  EXPECT_NE(p[0].header("x-request-id"), p[1].header("x-request-id"));
}

TEST_F(ProxyTest, DecodeAnswersWhilePrefillStillHoldsItsResponse) {
  start({1}, 1);
  auto release_prefill = std::make_shared<Gate>();
  prefills_[0]->server.set_handler(
      [release_prefill, &server = prefills_[0]->server](
          const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> writer) {
        server.spawn([release_prefill, writer] {
          release_prefill->wait(kWaitMs);
          writer->send(200, "application/json", R"({"choices":[]})");
        });
      });
  auto result = stream("/v1/completions", stream_body());
  // The whole decode answer arrived while the prefill server still held its response.
  bool prefill_got_it = prefills_[0]->server.wait_for_requests("/v1/completions", 1, kWaitMs);
  bool prefill_still_holding = !release_prefill->is_open();
  release_prefill->open();
  EXPECT_TRUE(prefill_got_it);
  EXPECT_TRUE(prefill_still_holding);
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.events.size(), 4u);
}

TEST_F(ProxyTest, RoundRobinOverPrefillRanksAndDecodes) {
  start({2, 2}, 2);
  constexpr int kRequests = 8;
  for (int i = 0; i < kRequests; ++i) {
    auto r =
        post("/v1/completions", R"({"prompt":"a"})", {{"X-Request-Id", "r" + std::to_string(i)}});
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r->status, 200) << r->body;
  }
  for (auto& p : prefills_) {
    ASSERT_TRUE(p->server.wait_for_requests("/v1/completions", kRequests / 2, kWaitMs));
  }
  for (int i = 0; i < kRequests; ++i) {
    std::string id = "r" + std::to_string(i);
    int want_prefill = (i / 2) % 2;
    int want_rank = i % 2;
    int want_decode = i % 2;
    int found_prefill = -1;
    std::string rank;
    for (size_t p = 0; p < prefills_.size(); ++p) {
      for (auto& req : prefills_[p]->server.requests_to("/v1/completions")) {
        if (req.header("x-request-id") == id) {
          found_prefill = static_cast<int>(p);
          rank = req.header("x-data-parallel-rank");
        }
      }
    }
    EXPECT_EQ(found_prefill, want_prefill) << id;
    EXPECT_EQ(rank, std::to_string(want_rank)) << id;
    int found_decode = -1;
    Json kv;
    for (size_t d = 0; d < decodes_.size(); ++d) {
      for (auto& req : decodes_[d]->requests_to("/v1/completions")) {
        if (req.header("x-request-id") == id) {
          found_decode = static_cast<int>(d);
          kv = parse(req.body)["kv_transfer_params"];
        }
      }
    }
    EXPECT_EQ(found_decode, want_decode) << id;
    EXPECT_EQ(kv["remote_engine_id"],
              "engine-" + std::to_string(want_prefill) + "-" + std::to_string(want_rank));
    EXPECT_EQ(kv["remote_bootstrap_addr"],
              "http://127.0.0.1:" +
                  std::to_string(prefills_[static_cast<size_t>(want_prefill)]->bootstrap.port()));
  }
}

TEST_F(ProxyTest, StreamsEachDecodeChunkAsItArrives) {
  start({1}, 1);
  auto client_saw_first = std::make_shared<Gate>();
  std::atomic<bool> decode_waited_for_client{false};
  decodes_[0]->set_handler([&, client_saw_first](const net::http::Request&,
                                                 std::shared_ptr<net::http::ResponseWriter> w) {
    w->start_stream(200, "text/event-stream");
    w->write("data: {\"n\":1}\n\n");
    decodes_[0]->spawn([&, client_saw_first, w] {
      // The second chunk waits until the client has the first: only a relay that forwards
      // as it goes lets this finish early.
      decode_waited_for_client = client_saw_first->wait(kWaitMs);
      w->write("data: {\"n\":2}\n\n");
      w->write("data: [DONE]\n\n");
      w->end();
    });
  });
  auto result = stream("/v1/completions", stream_body(), {}, [&](const std::string& e) {
    if (e == "{\"n\":1}") {
      client_saw_first->open();
    }
    return true;
  });
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_TRUE(decode_waited_for_client.load());
  EXPECT_EQ(result.events, (std::vector<std::string>{"{\"n\":1}", "{\"n\":2}", "[DONE]"}));
}

TEST_F(ProxyTest, AnswersNotReadyUntilTheBootstrapServerAnswers) {
  auto bootstrap_up = std::make_shared<std::atomic<bool>>(false);
  make_fakes({1}, 1);
  prefills_[0]->bootstrap.set_handler(
      [bootstrap_up, ready = testing::bootstrap_handler({"engine-x"})](
          const net::http::Request& r, std::shared_ptr<net::http::ResponseWriter> w) {
        if (!bootstrap_up->load()) {
          return w->send(503, "application/json", R"({"error":"1 of 2 ranks registered"})");
        }
        ready(r, std::move(w));
      });
  start_proxy(/*wait_ready=*/false);
  ASSERT_TRUE(prefills_[0]->bootstrap.wait_for_requests("/query", 2, kWaitMs));
  auto health = get("/health");
  ASSERT_TRUE(health.is_ok());
  EXPECT_EQ(health->status, 503);
  EXPECT_NE(health->body.find("bootstrap"), std::string::npos) << health->body;
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 503);
  Json error = parse(r->body);
  EXPECT_EQ(error["error"]["code"], 503);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("waiting for"), std::string::npos);
  EXPECT_NE(metrics().find("crescent_proxy_prefill_ready{prefill=\"" + prefills_[0]->server.url() +
                           "\"} 0"),
            std::string::npos);
  EXPECT_TRUE(decodes_[0]->requests_to("/v1/completions").empty());

  bootstrap_up->store(true);
  wait_until_ready();
  health = get("/health");
  ASSERT_TRUE(health.is_ok());
  EXPECT_EQ(health->status, 200);
  r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200);
  std::string m = metrics();
  EXPECT_NE(
      m.find("crescent_proxy_prefill_ready{prefill=\"" + prefills_[0]->server.url() + "\"} 1"),
      std::string::npos);
  EXPECT_NE(
      m.find("crescent_proxy_requests_total{endpoint=\"completions\",outcome=\"not_ready\"} 1"),
      std::string::npos);
}

bool wait_for_no_connections(const FakeServer& server) {
  auto deadline = Deadline::after_ms(kWaitMs);
  while (server.num_open_connections() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return server.num_open_connections() == 0;
}

// A decode server that never answers and records when its connection is closed.
FakeServer::Handler hold_forever(std::shared_ptr<Gate> closed) {
  return [closed](const net::http::Request& r, std::shared_ptr<net::http::ResponseWriter> w) {
    if (r.path == "/health") {
      return w->send(200, "application/json", "{}");
    }
    w->on_close([closed] { closed->open(); });
  };
}

TEST_F(ProxyTest, PrefillErrorAbortsDecodeAndReachesTheClient) {
  start({1}, 1);
  // The prefill fails once the decode server holds the request.
  prefills_[0]->server.set_handler(
      [this](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        prefills_[0]->server.spawn([this, w] {
          decodes_[0]->wait_for_requests("/v1/completions", 1, kWaitMs);
          w->send(500, "application/json",
                  R"({"error":{"message":"prefill exploded","type":"internal","code":500}})");
        });
      });
  auto decode_closed = std::make_shared<Gate>();
  decodes_[0]->set_handler(hold_forever(decode_closed));
  auto result = stream("/v1/completions", stream_body());
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 500);
  Json error = parse(result.body);
  std::string message = error["error"]["message"];
  EXPECT_NE(message.find(prefills_[0]->server.url()), std::string::npos) << message;
  EXPECT_NE(message.find("prefill exploded"), std::string::npos) << message;
  EXPECT_TRUE(decode_closed->wait(kWaitMs)) << "the decode request was not aborted";
  EXPECT_NE(metrics().find("crescent_proxy_upstream_errors_total{side=\"prefill\"} 1"),
            std::string::npos);
}

TEST_F(ProxyTest, UnreachablePrefillAnswers502AndAbortsDecode) {
  start({1}, 1);
  prefills_[0]->server.stop();
  auto decode_closed = std::make_shared<Gate>();
  decodes_[0]->set_handler(hold_forever(decode_closed));
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502);
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("prefill " + prefills_[0]->server.url()), std::string::npos) << message;
  // The refusal is instant, so the decode request may be closed before the server read it.
  EXPECT_TRUE(wait_for_no_connections(*decodes_[0]));
  EXPECT_TRUE(decode_closed->is_open() || decodes_[0]->requests_to("/v1/completions").empty());
}

TEST_F(ProxyTest, DecodeErrorStatusAndBodyPassThrough) {
  start({1}, 1);
  auto prefill_closed = std::make_shared<Gate>();
  // The prefill still works on it when the decode server fails: its request is abandoned.
  prefills_[0]->server.set_handler(hold_forever(prefill_closed));
  const std::string openai_error =
      R"({"error":{"message":"prompt too long","type":"invalid_request_error","param":null,"code":400}})";
  decodes_[0]->set_handler(
      [&](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        decodes_[0]->spawn([&, w] {
          prefills_[0]->server.wait_for_requests("/v1/completions", 1, kWaitMs);
          w->send(400, "application/json", openai_error);
        });
      });
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, openai_error);
  EXPECT_TRUE(prefill_closed->wait(kWaitMs)) << "the prefill request was not abandoned";

  prefills_[0]->server.set_handler(testing::prefill_handler());
  decodes_[0]->set_handler(
      [](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        w->send(503, "text/plain", "overloaded");
      });
  r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 503);
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("overloaded"), std::string::npos) << message;
  EXPECT_NE(message.find(decodes_[0]->url()), std::string::npos) << message;
}

TEST_F(ProxyTest, UnreachableDecodeAnswers502) {
  start({1}, 1);
  decodes_[0]->stop();
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502);
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("decode " + decodes_[0]->url()), std::string::npos) << message;
}

TEST_F(ProxyTest, DecodeDyingMidStreamEndsTheStreamWithAnErrorEvent) {
  // A decode server that sends one event and dies (closes the connection mid-stream).
  testing::RawServer dying([](const net::Fd& fd, const std::string&) {
    std::string answer =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    std::string event = "data: {\"n\":1}\n\n";
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", event.size());
    answer += size + event + "\r\n";
    (void)net::write_all(fd, answer.data(), answer.size(), Deadline::after_ms(kWaitMs));
  });
  make_fakes({1}, 0);
  decode_urls_ = {dying.url()};
  start_proxy(/*wait_ready=*/true);
  auto result = stream("/v1/completions", stream_body());
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 200);
  ASSERT_EQ(result.events.size(), 3u) << result.body;
  EXPECT_EQ(result.events[0], "{\"n\":1}");
  Json error = parse(result.events[1]);
  ASSERT_TRUE(error.contains("error")) << result.events[1];
  EXPECT_NE(error["error"]["message"].get<std::string>().find(dying.url()), std::string::npos)
      << result.events[1];
  EXPECT_EQ(result.events[2], "[DONE]");
  EXPECT_NE(metrics().find("crescent_proxy_upstream_errors_total{side=\"decode\"} 1"),
            std::string::npos);
}

TEST_F(ProxyTest, ClientLeavingClosesDecodeAndPendingPrefill) {
  start({1}, 1);
  auto prefill_closed = std::make_shared<Gate>();
  prefills_[0]->server.set_handler(hold_forever(prefill_closed));
  auto decode_closed = std::make_shared<Gate>();
  decodes_[0]->set_handler(
      [decode_closed](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        w->on_close([decode_closed] { decode_closed->open(); });
        w->start_stream(200, "text/event-stream");
        w->write("data: {\"n\":1}\n\n");
      });
  // Hang up at the first event, once the prefill server holds its half (before that, closing
  // its connection may stop the request before its handler ever runs).
  auto result = stream("/v1/completions", stream_body(), {}, [this](const std::string&) {
    prefills_[0]->server.wait_for_requests("/v1/completions", 1, kWaitMs);
    return false;
  });
  EXPECT_EQ(result.events.size(), 1u);
  EXPECT_TRUE(decode_closed->wait(kWaitMs)) << "the decode server never saw the client leave";
  EXPECT_TRUE(prefill_closed->wait(kWaitMs)) << "the prefill server never saw the client leave";
  auto deadline = Deadline::after_ms(kWaitMs);
  while (proxy_->num_in_flight() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(proxy_->num_in_flight(), 0);
  EXPECT_NE(metrics().find("outcome=\"client_disconnected\"} 1"), std::string::npos);
}

TEST_F(ProxyTest, RequestTimeoutAnswers504AndClosesUpstreams) {
  start({1}, 1, true, [](ProxyOptions& o) { o.request_timeout_s = 0.3; });
  auto decode_closed = std::make_shared<Gate>();
  decodes_[0]->set_handler(hold_forever(decode_closed));
  auto started = std::chrono::steady_clock::now();
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_LT(secs, 5.0);
  EXPECT_TRUE(decode_closed->wait(kWaitMs));
}

TEST_F(ProxyTest, WholeResponsesAndKeepAliveReuse) {
  start({1}, 1);
  for (int i = 0; i < 5; ++i) {
    auto r = post("/v1/completions", R"({"prompt":"a","max_tokens":2})");
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("content-type"), "application/json");
    EXPECT_EQ(parse(r->body)["choices"][0]["text"], "hello world");
    // The prefill call may end after the client has its answer; its connection is reusable
    // only then.
    auto deadline = Deadline::after_ms(kWaitMs);
    while (proxy_->upstream_stats().num_in_flight > 0 && !deadline.is_expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  auto stats = proxy_->upstream_stats();
  EXPECT_EQ(stats.num_connects, 2);  // one to the prefill, one to the decode server
  EXPECT_EQ(stats.num_reuses, 8);
  EXPECT_EQ(stats.num_idle, 2);
  EXPECT_EQ(prefills_[0]->server.num_open_connections(), 2);  // the poller's and the proxy's
  EXPECT_EQ(decodes_[0]->num_open_connections(), 1);
}

TEST_F(ProxyTest, ModelsMetricsAndBadInput) {
  start({1}, 1);
  auto models = get("/v1/models");
  ASSERT_TRUE(models.is_ok());
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(parse(models->body)["data"][0]["id"], "fake-model");

  auto missing = get("/v2/nothing");
  ASSERT_TRUE(missing.is_ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(parse(missing->body)["error"].is_object());

  auto wrong_method = get("/v1/completions");
  ASSERT_TRUE(wrong_method.is_ok());
  EXPECT_EQ(wrong_method->status, 405);

  for (const char* body : {"", "not json", "[1,2]"}) {
    auto r = post("/v1/completions", body);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_EQ(parse(r->body)["error"]["type"], "invalid_request_error");
  }
  EXPECT_TRUE(prefills_[0]->server.requests_to("/v1/completions").empty());

  std::string m = metrics();
  for (const char* name :
       {"crescent_proxy_requests_total{endpoint=\"completions\",outcome=\"bad_request\"} 3",
        "crescent_proxy_requests_total{endpoint=\"models\",outcome=\"ok\"} 1",
        "crescent_proxy_requests_in_flight 0", "crescent_proxy_time_to_first_byte_seconds_count",
        "crescent_proxy_upstream_errors_total{side=\"decode\"} 0",
        "crescent_proxy_prefill_dp_size{prefill=\""}) {
    EXPECT_NE(m.find(name), std::string::npos) << name << "\n" << m;
  }
}

// vLLM's /tokenize and /detokenize go to a decode server whole (so that clients such as
// `crescent bench serve` can tokenize through the proxy); other methods are a 405.
TEST_F(ProxyTest, TokenizeAndDetokenizeAreRelayedToADecodeServer) {
  start({1}, 1);
  auto t = post("/tokenize", R"({"model":"fake-model","prompt":"a b"})");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->status, 200) << t->body;
  EXPECT_EQ(parse(t->body)["tokens"], Json::parse("[7,8,9]"));
  auto d = post("/detokenize", R"({"tokens":[7,8]})");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(parse(d->body)["prompt"], "seven eight");
  ASSERT_EQ(decodes_[0]->requests_to("/tokenize").size(), 1u);
  EXPECT_EQ(decodes_[0]->requests_to("/tokenize")[0].body,
            R"({"model":"fake-model","prompt":"a b"})");
  EXPECT_EQ(decodes_[0]->requests_to("/detokenize")[0].body, R"({"tokens":[7,8]})");
  EXPECT_TRUE(prefills_[0]->server.requests_to("/tokenize").empty());
  auto wrong_method = get("/tokenize");
  ASSERT_TRUE(wrong_method.is_ok());
  EXPECT_EQ(wrong_method->status, 405);
  std::string m = metrics();
  EXPECT_NE(m.find("crescent_proxy_requests_total{endpoint=\"tokenize\",outcome=\"ok\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("crescent_proxy_requests_total{endpoint=\"detokenize\",outcome=\"ok\"} 1"),
            std::string::npos);
}

// A number a double cannot hold is refused with a 400 that names it, before any upstream
// sees the request; the proxy goes on serving.
TEST_F(ProxyTest, NumberOverflowIs400AndTheProxyKeepsServing) {
  start({1}, 1);
  struct Case {
    const char* path;
    std::string body;
    std::string number;
  };
  const Case cases[] = {
      {"/v1/completions", R"({"model":"x","prompt":"a","max_tokens":1e400})", "1e400"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"temperature":-1e400})", "-1e400"},
  };
  for (const auto& c : cases) {
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 400) << c.body << " -> " << r->body;
    Json e = parse(r->body);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
    const std::string message = e["error"]["message"];
    EXPECT_NE(message.find("the request body has a number out of range"), std::string::npos)
        << message;
    EXPECT_NE(message.find(c.number + " does not fit in a double"), std::string::npos) << message;
    auto ok = post("/v1/completions", R"({"model":"m","prompt":"a","max_tokens":2})");
    ASSERT_TRUE(ok.is_ok());
    EXPECT_EQ(ok->status, 200) << ok->body;
  }
  // P's half may be recorded after D's answer reached the client.
  EXPECT_TRUE(prefills_[0]->server.wait_for_requests("/v1/completions", 2, kWaitMs));
  EXPECT_EQ(prefills_[0]->server.requests_to("/v1/completions").size(), 2u);
  EXPECT_TRUE(prefills_[0]->server.requests_to("/v1/chat/completions").empty());
}

TEST_F(ProxyTest, RefusesAnXRequestIdAlreadyInFlight) {
  start({1}, 1);
  auto release = std::make_shared<Gate>();
  decodes_[0]->set_handler(
      [this, release](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        decodes_[0]->spawn([release, w] {
          release->wait(kWaitMs);
          w->send(200, "application/json", R"({"choices":[]})");
        });
      });
  StreamResult first_result;
  std::thread first([&] {
    first_result = stream("/v1/completions", stream_body(), {{"X-Request-Id", "same"}});
  });
  ASSERT_TRUE(decodes_[0]->wait_for_requests("/v1/completions", 1, kWaitMs));
  auto r = post("/v1/completions", stream_body(), {{"X-Request-Id", "same"}});
  release->open();
  first.join();
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(first_result.http_status, 200);
  // Once both calls of the first request have ended, its id is free again.
  auto deadline = Deadline::after_ms(kWaitMs);
  do {
    r = post("/v1/completions", R"({"prompt":"a"})", {{"X-Request-Id", "same"}});
  } while (r.is_ok() && r->status == 409 && !deadline.is_expired());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ProxyTest, TwoHundredConcurrentStreams) {
  start({1, 1}, 2);
  for (auto& d : decodes_) {
    d->set_handler(testing::decode_handler(d.get(), /*num_chunks=*/4, /*chunk_delay_ms=*/5));
  }
  constexpr int kClients = 200;
  std::vector<std::thread> threads;
  std::vector<StreamResult> results(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back(
        [&, i] { results[static_cast<size_t>(i)] = stream("/v1/completions", stream_body()); });
  }
  for (auto& t : threads) {
    t.join();
  }
  int num_ok = 0;
  for (const auto& r : results) {
    if (r.status.is_ok() && r.http_status == 200 && r.events.size() == 5 &&
        r.events.back() == "[DONE]") {
      ++num_ok;
    } else {
      ADD_FAILURE() << r.status.to_string() << " " << r.http_status << " " << r.body;
    }
  }
  EXPECT_EQ(num_ok, kClients);
  EXPECT_EQ(proxy_->num_in_flight(), 0);
}

}  // namespace
}  // namespace crescent::proxy

namespace crescent::proxy {
namespace {

TEST_F(ProxyTest, DefaultAuthorizationWhenTheClientSendsNone) {
  start({1}, 1, true, [](ProxyOptions& o) { o.default_authorization = "Bearer from-env"; });
  auto r = post("/v1/completions", R"({"prompt":"a"})");
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests("/v1/completions", 1, kWaitMs));
  EXPECT_EQ(prefills_[0]->server.requests_to("/v1/completions")[0].header("authorization"),
            "Bearer from-env");
  EXPECT_EQ(decodes_[0]->requests_to("/v1/completions")[0].header("authorization"),
            "Bearer from-env");
}

// --api-key: clients need the key on every path but /health and /metrics; --upstream-api-key
// is what P and D get, in place of the client's header.
TEST_F(ProxyTest, ApiKeyGuardsTheClientSideAndUpstreamKeyGoesToPAndD) {
  start({1}, 1, true, [](ProxyOptions& o) {
    o.api_key = "sk-proxy";
    o.upstream_api_key = "sk-workers";
    o.default_authorization = "Bearer from-env";  // the upstream key wins over it too
  });
  const char* body = R"({"prompt":"a","max_tokens":2})";
  const std::pair<std::optional<std::string>, const char*> refused[] = {
      {std::nullopt, "needs an API key"},
      {"Basic sk-proxy", "Bearer scheme"},
      {"Bearer sk-workers", "invalid API key"},
  };
  for (const auto& [header, says] : refused) {
    net::http::Headers h;
    if (header) {
      h["Authorization"] = *header;
    }
    auto r = post("/v1/completions", body, h);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 401) << r->body;
    EXPECT_EQ(r->header("www-authenticate"), "Bearer");
    Json e = parse(r->body);
    EXPECT_EQ(e["error"]["code"], 401);
    EXPECT_EQ(e["error"]["type"], "authentication_error");
    const std::string message = e["error"]["message"];
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_EQ(message.find("sk-"), std::string::npos) << message;
  }
  HttpClient client("127.0.0.1", proxy_->port());
  auto models = client.request("GET", "/v1/models", "", {}, soon());
  ASSERT_TRUE(models.is_ok());
  EXPECT_EQ(models->status, 401);
  EXPECT_TRUE(prefills_[0]->server.requests_to("/v1/completions").empty());
  EXPECT_TRUE(decodes_[0]->requests_to("/v1/completions").empty());
  EXPECT_TRUE(decodes_[0]->requests_to("/v1/models").empty());
  EXPECT_EQ(get("/health")->status, 200);
  EXPECT_EQ(get("/metrics")->status, 200);

  auto ok = post("/v1/completions", body, {{"Authorization", "Bearer sk-proxy"}});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto listed =
      client.request("GET", "/v1/models", "", {{"Authorization", "Bearer sk-proxy"}}, soon());
  ASSERT_TRUE(listed.is_ok());
  EXPECT_EQ(listed->status, 200) << listed->body;
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests("/v1/completions", 1, kWaitMs));
  EXPECT_EQ(prefills_[0]->server.requests_to("/v1/completions")[0].header("authorization"),
            "Bearer sk-workers");
  EXPECT_EQ(decodes_[0]->requests_to("/v1/completions")[0].header("authorization"),
            "Bearer sk-workers");
  EXPECT_EQ(decodes_[0]->requests_to("/v1/models")[0].header("authorization"), "Bearer sk-workers");
}

TEST_F(ProxyTest, DeepNestingIs400BeforeAnyUpstream) {
  start({1}, 1);
  std::string body = R"({"prompt":"a","user":)";
  body.append(100'000, '[').append(100'000, ']').append("}");
  auto r = post("/v1/completions", body);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 400) << r->body.substr(0, 200);
  EXPECT_NE(r->body.find("more than 512 levels deep"), std::string::npos) << r->body;
  EXPECT_TRUE(prefills_[0]->server.requests_to("/v1/completions").empty());
  EXPECT_TRUE(decodes_[0]->requests_to("/v1/completions").empty());
}

TEST(ProxyServerStartTest, TakenPortIsAnErrorNotACrash) {
  FakeServer taken([](const net::http::Request&, auto w) { w->send(200, "text/plain", ""); });
  ProxyOptions options;
  options.port = taken.port();
  options.prefills.push_back({*parse_upstream_url("http://127.0.0.1:1"), 2});
  options.decodes.push_back(*parse_upstream_url("http://127.0.0.1:3"));
  auto proxy = ProxyServer::start(options);
  ASSERT_FALSE(proxy.is_ok());
  EXPECT_EQ(proxy.status().code(), StatusCode::kUnavailable);
  options.decodes.clear();
  EXPECT_EQ(ProxyServer::start(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::proxy

// The encoder stage of EPD (DESIGN.md §2b).
namespace crescent::proxy {
namespace {

const char* const kChat = "/v1/chat/completions";

// A chat body whose one user message holds `urls` as image parts (alternating the object and
// the string form of image_url) after a text part.
std::string chat_with_images(const std::vector<std::string>& urls, bool stream = false) {
  Json content = Json::array({Json{{"type", "text"}, {"text", "what is this?"}}});
  for (size_t i = 0; i < urls.size(); ++i) {
    if (i % 2 == 0) {
      content.push_back(Json{{"type", "image_url"}, {"image_url", Json{{"url", urls[i]}}}});
    } else {
      content.push_back(Json{{"type", "image_url"}, {"image_url", urls[i]}});
    }
  }
  Json body = {{"model", "vl"},
               {"messages", Json::array({Json{{"role", "user"}, {"content", content}}})},
               {"max_tokens", 8},
               {"stream", stream}};
  return body.dump();
}

// The image URL of the one image part of an encoder request.
std::string image_url_of_encoder_request(const testing::CapturedRequest& r) {
  Json body = parse(r.body);
  const Json& image = body["messages"][0]["content"][0]["image_url"];
  return image.is_string() ? image.get<std::string>() : image["url"].get<std::string>();
}

size_t num_requests_to(const std::vector<std::unique_ptr<FakeServer>>& servers,
                       const std::string& path) {
  size_t n = 0;
  for (const auto& s : servers) {
    n += s->requests_to(path).size();
  }
  return n;
}

TEST_F(ProxyTest, EpdEncodesImagesInParallelAndGivesPrefillTheMergedItemsInOrder) {
  add_encoders(2);
  // Every encoder answer waits until all three images have reached the encoders (so only
  // parallel calls can finish), and the first image is answered last.
  for (size_t e = 0; e < encoders_.size(); ++e) {
    FakeServer* self = encoders_[e].get();
    self->set_handler(
        [this, self, name = "e" + std::to_string(e)](const net::http::Request& request,
                                                     std::shared_ptr<net::http::ResponseWriter> w) {
          self->spawn([this, name, request, w] {
            auto deadline = Deadline::after_ms(kWaitMs);
            while (num_requests_to(encoders_, kChat) < 3 && !deadline.is_expired()) {
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            std::string url = parse(request.body)["messages"][0]["content"][0]["image_url"].dump();
            int delay_ms = url.find("img0") != std::string::npos ? 80 : 0;
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            testing::encoder_handler(name)(request, w);
          });
        });
  }
  start({1}, 1);
  std::vector<std::string> urls = {"http://images/img0.png", "http://images/img1.png",
                                   "data:image/png;base64,aW1nMg=="};
  std::string client_body = chat_with_images(urls, /*stream=*/true);
  auto result = stream(kChat, client_body, {{"X-Request-Id", "epd-1"}});
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 200) << result.body;
  ASSERT_FALSE(result.events.empty());
  EXPECT_EQ(result.events.back(), "[DONE]");

  // Three encoder calls, round-robin: images 0 and 2 on e0, image 1 on e1; each the exact body.
  auto e0 = encoders_[0]->requests_to(kChat);
  auto e1 = encoders_[1]->requests_to(kChat);
  ASSERT_EQ(e0.size(), 2u);
  ASSERT_EQ(e1.size(), 1u);
  Json client = parse(client_body);
  const Json& parts = client["messages"][0]["content"];
  std::map<std::string, Json> part_of_url;
  for (size_t i = 0; i < urls.size(); ++i) {
    part_of_url[urls[i]] = parts[i + 1];
  }
  for (const auto& r : {e0[0], e0[1], e1[0]}) {
    std::string url = image_url_of_encoder_request(r);
    Json expected = {
        {"model", "vl"},
        {"messages",
         Json::array({Json{{"role", "user"}, {"content", Json::array({part_of_url[url]})}}})},
        {"max_tokens", 1},
        {"stream", false}};
    EXPECT_EQ(parse(r.body), expected) << r.body;
    EXPECT_EQ(r.header("content-type"), "application/json");
    EXPECT_EQ(r.header("x-request-id").rfind("epd-1-img", 0), 0u) << r.header("x-request-id");
  }
  std::set<std::string> e0_urls = {image_url_of_encoder_request(e0[0]),
                                   image_url_of_encoder_request(e0[1])};
  EXPECT_EQ(e0_urls, (std::set<std::string>{urls[0], urls[2]}));
  EXPECT_EQ(image_url_of_encoder_request(e1[0]), urls[1]);

  // P: the prefill body of today plus the items, in image order.
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests(kChat, 1, kWaitMs));
  auto p = prefills_[0]->server.requests_to(kChat);
  Json p_body = parse(p[0].body);
  Json expected_items = Json::array();
  std::vector<std::string> encoder_of_image = {"e0", "e1", "e0"};
  for (size_t i = 0; i < urls.size(); ++i) {
    // Items are passed on as the encoder wrote them (the fake's keys are sorted).
    expected_items.push_back(
        Json{{"encoder", encoder_of_image[i]}, {"mm_hash", testing::fake_mm_hash(urls[i])}});
  }
  EXPECT_EQ(p_body["ec_transfer_params"], Json({{"items", expected_items}})) << p[0].body;
  EXPECT_EQ(p_body["max_tokens"], 1);
  EXPECT_EQ(p_body["stream"], false);
  EXPECT_EQ(p_body["kv_transfer_params"]["transfer_id"], "xfer-epd-1");
  EXPECT_EQ(p_body["messages"], client["messages"]);

  // D: today's decode body plus the same items (for each image's mm_hash and grid), and each
  // image's url replaced by a reference to its item: no pixels.
  auto d = decodes_[0]->requests_to(kChat);
  ASSERT_EQ(d.size(), 1u);
  Json d_body = parse(d[0].body);
  EXPECT_EQ(d_body["ec_transfer_params"], Json({{"items", expected_items}})) << d[0].body;
  Json expected_d = client;
  Json& d_parts = expected_d["messages"][0]["content"];
  for (size_t i = 0; i < urls.size(); ++i) {
    Json& image = d_parts[i + 1]["image_url"];
    const std::string ref = "ec://" + testing::fake_mm_hash(urls[i]);
    if (image.is_string()) {
      image = ref;
    } else {
      image["url"] = ref;
    }
  }
  expected_d["ec_transfer_params"] = Json({{"items", expected_items}});
  expected_d["kv_transfer_params"] =
      Json{{"do_remote_decode", false},
           {"do_remote_prefill", true},
           {"remote_bootstrap_addr",
            "http://127.0.0.1:" + std::to_string(prefills_[0]->bootstrap.port())},
           {"remote_engine_id", "engine-0-0"},
           {"transfer_id", "xfer-epd-1"}};
  EXPECT_EQ(d_body, expected_d) << d[0].body;

  std::string m = metrics();
  for (const std::string& line :
       {"crescent_proxy_encoder_requests_total{encoder=\"" + encoders_[0]->url() + "\"} 2",
        "crescent_proxy_encoder_requests_total{encoder=\"" + encoders_[1]->url() + "\"} 1",
        "crescent_proxy_encoder_failures_total{encoder=\"" + encoders_[0]->url() + "\"} 0",
        std::string("crescent_proxy_encode_seconds_count 1"),
        std::string("crescent_proxy_encoder_affinity_total 0"),
        std::string(
            "crescent_proxy_requests_total{endpoint=\"chat_completions\",outcome=\"ok\"} 1")}) {
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  }
}

TEST_F(ProxyTest, EpdTextOnlyRequestsNeverTouchTheEncoders) {
  add_encoders(1);
  start({1}, 1);
  auto r = post(kChat, R"({"model":"vl","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
  r = post(
      kChat,
      R"({"model":"vl","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
  // Images in a completions request are not for the proxy to find.
  r = post("/v1/completions", R"({"prompt":"a","image_url":"http://x/y.png"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests(kChat, 2, kWaitMs));
  EXPECT_TRUE(encoders_[0]->requests().empty());
  for (const auto& p : prefills_[0]->server.requests_to(kChat)) {
    EXPECT_FALSE(parse(p.body).contains("ec_transfer_params")) << p.body;
  }
}

TEST_F(ProxyTest, EpdWithoutEncodersSendsImagesToPrefillAsToday) {
  start({1}, 1);
  std::string body = chat_with_images({"http://images/a.png"});
  auto r = post(kChat, body, {{"X-Request-Id", "no-enc"}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests(kChat, 1, kWaitMs));
  Json p = parse(prefills_[0]->server.requests_to(kChat)[0].body);
  EXPECT_FALSE(p.contains("ec_transfer_params"));
  EXPECT_EQ(p["messages"], parse(body)["messages"]);
}

TEST_F(ProxyTest, EpdEncoderRefusalPassesThroughAndPrefillDecodeNeverStart) {
  add_encoders(1);
  const std::string refusal =
      R"({"error":{"message":"image too large: 9000x9000 > --max-image-pixels","type":"invalid_request_error","param":null,"code":400}})";
  encoders_[0]->set_handler(
      [&](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        w->send(400, "application/json", refusal);
      });
  start({1}, 1);
  auto r = post(kChat, chat_with_images({"http://images/huge.png"}), {{"X-Request-Id", "big"}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, refusal);
  EXPECT_EQ(r->header("x-request-id"), "big");
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
  EXPECT_TRUE(decodes_[0]->requests_to(kChat).empty());
  // A refusal that is not OpenAI-shaped is wrapped in one, keeping its status.
  encoders_[0]->set_handler(
      [](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
        w->send(413, "text/plain", "payload too large");
      });
  r = post(kChat, chat_with_images({"http://images/huge2.png"}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 413);
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("payload too large"), std::string::npos) << message;
  EXPECT_NE(message.find(encoders_[0]->url()), std::string::npos) << message;
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
  EXPECT_TRUE(decodes_[0]->requests_to(kChat).empty());
  // The request id is free again.
  encoders_[0]->set_handler(testing::encoder_handler("e0"));
  r = post(kChat, chat_with_images({"http://images/ok.png"}), {{"X-Request-Id", "big"}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(metrics().find("crescent_proxy_requests_total{endpoint=\"chat_completions\",outcome="
                           "\"encoder_error\"} 2"),
            std::string::npos);
}

TEST_F(ProxyTest, EpdEncoderDownOrFailingAnswers502Or503NamingIt) {
  add_encoders(1);
  start({1}, 1);
  encoders_[0]->stop();
  auto r = post(kChat, chat_with_images({"http://images/a.png"}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502);
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("encoder " + encoders_[0]->url()), std::string::npos) << message;
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
  EXPECT_TRUE(decodes_[0]->requests_to(kChat).empty());
  std::string m = metrics();
  EXPECT_NE(
      m.find("crescent_proxy_encoder_failures_total{encoder=\"" + encoders_[0]->url() + "\"} 1"),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("crescent_proxy_upstream_errors_total{side=\"encoder\"} 1"), std::string::npos);
}

TEST_F(ProxyTest, EpdEncoderErrorsAndBadAnswers) {
  add_encoders(1);
  start({1}, 1);
  struct Case {
    int status;
    std::string body;
    int want_status;
    const char* want_text;
  };
  for (const Case& c : std::vector<Case>{
           {503, R"({"error":{"message":"tensor pool full","type":"x","code":503}})", 503,
            "tensor pool full"},
           {500, "boom", 502, "boom"},
           {200, R"({"choices":[]})", 502, "ec_transfer_params"},
           {200, R"({"ec_transfer_params":{"items":[{"no_hash":1}]}})", 502, "mm_hash"},
           {200, R"({"ec_transfer_params":{"items":[]}})", 502, "items"},
       }) {
    encoders_[0]->set_handler(
        [c](const net::http::Request&, std::shared_ptr<net::http::ResponseWriter> w) {
          w->send(c.status, "application/json", c.body);
        });
    auto r = post(kChat, chat_with_images({"http://images/a.png", "http://images/b.png"}));
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, c.want_status) << r->body;
    std::string message = parse(r->body)["error"]["message"];
    EXPECT_NE(message.find(c.want_text), std::string::npos) << message;
    EXPECT_NE(message.find("encoder " + encoders_[0]->url()), std::string::npos) << message;
  }
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
  EXPECT_TRUE(decodes_[0]->requests_to(kChat).empty());
  auto deadline = Deadline::after_ms(kWaitMs);
  while (proxy_->num_in_flight() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(proxy_->num_in_flight(), 0);
}

TEST_F(ProxyTest, EpdEncodeTimeoutAnswers502AndClosesTheEncoderCall) {
  add_encoders(1);
  auto closed = std::make_shared<Gate>();
  encoders_[0]->set_handler(hold_forever(closed));
  start({1}, 1, true, [](ProxyOptions& o) { o.encode_timeout_s = 0.3; });
  auto r = post(kChat, chat_with_images({"http://images/slow.png"}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502) << r->body;
  std::string message = parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("--encode-timeout-s"), std::string::npos) << message;
  EXPECT_NE(message.find(encoders_[0]->url()), std::string::npos) << message;
  EXPECT_TRUE(closed->wait(kWaitMs));
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
}

TEST_F(ProxyTest, EpdClientLeavingWhileEncodingClosesEveryEncoderCall) {
  add_encoders(2);
  auto closed_0 = std::make_shared<Gate>();
  auto closed_1 = std::make_shared<Gate>();
  encoders_[0]->set_handler(hold_forever(closed_0));
  encoders_[1]->set_handler(hold_forever(closed_1));
  start({1}, 1);
  {
    HttpClient client("127.0.0.1", proxy_->port());
    auto r = client.request("POST", kChat, chat_with_images({"http://i/a.png", "http://i/b.png"}),
                            {{"Content-Type", "application/json"}}, Deadline::after_ms(300));
    EXPECT_FALSE(r.is_ok());
  }  // the client's connection closes
  EXPECT_TRUE(closed_0->wait(kWaitMs)) << "the encoder call was not closed";
  EXPECT_TRUE(closed_1->wait(kWaitMs)) << "the encoder call was not closed";
  auto deadline = Deadline::after_ms(kWaitMs);
  while (proxy_->num_in_flight() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(proxy_->num_in_flight(), 0);
  EXPECT_TRUE(prefills_[0]->server.requests_to(kChat).empty());
  EXPECT_TRUE(decodes_[0]->requests_to(kChat).empty());
  EXPECT_NE(metrics().find("outcome=\"client_disconnected\"} 1"), std::string::npos);
}

TEST_F(ProxyTest, EpdRepeatedImageGoesToTheEncoderThatHadIt) {
  add_encoders(3);
  start({1}, 1);
  // Round-robin for new images; X (and the same bytes as a data: URL with another media type)
  // always back to the encoder that had it first.
  const std::string x = "data:image/png;base64,WFhYWA==";
  const std::string x_again = "data:image/jpeg;base64,WFhYWA==";
  std::vector<std::vector<std::string>> requests = {
      {x}, {"http://i/b.png"}, {x_again, "http://i/c.png"}, {"http://i/d.png", x}, {x}};
  for (const auto& urls : requests) {
    auto r = post(kChat, chat_with_images(urls));
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r->status, 200) << r->body;
  }
  std::map<std::string, std::set<size_t>> encoders_of;
  for (size_t e = 0; e < encoders_.size(); ++e) {
    for (const auto& r : encoders_[e]->requests_to(kChat)) {
      std::string url = image_url_of_encoder_request(r);
      encoders_of[url == x_again ? x : url].insert(e);
    }
  }
  EXPECT_EQ(encoders_of[x], std::set<size_t>{0});
  EXPECT_EQ(encoders_of["http://i/b.png"], std::set<size_t>{1});
  EXPECT_EQ(encoders_of["http://i/c.png"], std::set<size_t>{2});
  EXPECT_EQ(encoders_of["http://i/d.png"], std::set<size_t>{0});
  EXPECT_NE(metrics().find("crescent_proxy_encoder_affinity_total 3"), std::string::npos);
}

TEST_F(ProxyTest, EpdLargeBodiesAreHandledOffTheIoThreadsAndArriveIntact) {
  add_encoders(1);
  start({1}, 1);
  // Over the 256 KiB at which parsing and rewriting move to the proxy's body worker.
  const std::string big = "data:image/png;base64," + std::string(400 << 10, 'Q');
  const std::vector<std::string> urls = {big, "http://i/small.png"};
  auto result = stream(kChat, chat_with_images(urls, /*stream=*/true), {{"X-Request-Id", "big"}});
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 200) << result.body;
  ASSERT_FALSE(result.events.empty());
  EXPECT_EQ(result.events.back(), "[DONE]");
  std::set<std::string> encoded;
  for (const auto& r : encoders_[0]->requests_to(kChat)) {
    encoded.insert(image_url_of_encoder_request(r));
  }
  EXPECT_EQ(encoded, (std::set<std::string>{big, urls[1]}));
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests(kChat, 1, kWaitMs));
  auto p = prefills_[0]->server.requests_to(kChat);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(parse(p[0].body)["messages"][0]["content"][1]["image_url"]["url"], big);
  auto d = decodes_[0]->requests_to(kChat);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_LT(d[0].body.size(), 4096u) << "D got pixels";
  // A large text-only body takes the same worker.
  auto text = post("/v1/completions",
                   Json{{"prompt", std::string(300 << 10, 'x')}, {"max_tokens", 2}}.dump());
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(text->status, 200) << text->body;
}

TEST_F(ProxyTest, EpdPrefillImagesRefSendsPrefillReferencesOnly) {
  add_encoders(1);
  start({1}, 1, /*wait_ready=*/true, [](ProxyOptions& o) { o.prefill_image_refs = true; });
  const std::vector<std::string> urls = {"data:image/png;base64,aW1nMA==", "http://i/b.png"};
  auto r = post(kChat, chat_with_images(urls));
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(prefills_[0]->server.wait_for_requests(kChat, 1, kWaitMs));
  for (const auto& body :
       {prefills_[0]->server.requests_to(kChat)[0].body, decodes_[0]->requests_to(kChat)[0].body}) {
    Json parts = parse(body)["messages"][0]["content"];
    EXPECT_EQ(parts[1]["image_url"]["url"], "ec://" + testing::fake_mm_hash(urls[0])) << body;
    EXPECT_EQ(parts[2]["image_url"], "ec://" + testing::fake_mm_hash(urls[1])) << body;
    EXPECT_EQ(parse(body)["ec_transfer_params"]["items"].size(), 2u) << body;
  }
}

TEST_F(ProxyTest, EpdWithColocatedPrefillDecodeServers) {
  add_encoders(1);
  make_fakes({}, 0);
  FakeServer pd([](auto&&...) {});
  pd.set_handler(testing::decode_handler(&pd));
  start_proxy(/*wait_ready=*/true,
              [&](ProxyOptions& o) { o.pds.push_back(*parse_upstream_url(pd.url())); });
  auto health = get("/health");
  ASSERT_TRUE(health.is_ok());
  EXPECT_EQ(health->status, 200);
  std::string body = chat_with_images({"http://i/a.png"}, /*stream=*/true);
  auto result = stream(kChat, body, {{"X-Request-Id", "pd-1"}});
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_EQ(result.http_status, 200);
  EXPECT_EQ(result.events.back(), "[DONE]");
  auto got = pd.requests_to(kChat);
  ASSERT_EQ(got.size(), 1u);
  Json expected = parse(body);
  expected["ec_transfer_params"] =
      Json{{"items", Json::array({Json{{"encoder", "e0"},
                                       {"mm_hash", testing::fake_mm_hash("http://i/a.png")}}})}};
  EXPECT_EQ(parse(got[0].body), expected) << got[0].body;
  EXPECT_EQ(got[0].header("x-request-id"), "pd-1");
  // Text goes to the pd server untouched.
  std::string text = R"({"model":"vl","messages":[{"role":"user","content":"hi"}]})";
  auto r = post(kChat, text);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(pd.requests_to(kChat).back().body, text);
  EXPECT_EQ(encoders_[0]->requests_to(kChat).size(), 1u);
  // A pd server that is down is named.
  pd.stop();
  r = post(kChat, text);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 502);
  EXPECT_NE(r->body.find("pd " + pd.url()), std::string::npos) << r->body;
}

}  // namespace
}  // namespace crescent::proxy
