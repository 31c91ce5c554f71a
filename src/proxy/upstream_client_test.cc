#include "proxy/upstream_client.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "proxy/fake_upstreams.h"

namespace crescent::proxy {
namespace {

using testing::FakeServer;
using testing::Gate;

constexpr int64_t kWaitMs = 10'000;

// What one call delivered, collected from its callbacks.
struct Outcome {
  int status = 0;
  net::http::Headers headers;
  std::vector<std::string> pieces;
  Status done;
};

struct Collector {
  std::shared_ptr<std::promise<Outcome>> promise = std::make_shared<std::promise<Outcome>>();
  std::shared_ptr<Outcome> outcome = std::make_shared<Outcome>();
  std::function<void(const std::string&)> on_piece;

  UpstreamCallbacks callbacks() {
    return {.on_headers =
                [o = outcome](int status, const net::http::Headers& h) {
                  o->status = status;
                  o->headers = h;
                },
            .on_data =
                [o = outcome, f = on_piece](std::string data) {
                  o->pieces.push_back(data);
                  if (f) {
                    f(data);
                  }
                },
            .on_done =
                [o = outcome, p = promise](Status s) {
                  o->done = s;
                  p->set_value(*o);
                }};
  }
  Outcome wait() {
    auto future = promise->get_future();
    if (future.wait_for(std::chrono::milliseconds(kWaitMs)) != std::future_status::ready) {
      ADD_FAILURE() << "the call never ended";
      return {};
    }
    return future.get();
  }
};

UpstreamRequest post(std::string body) {
  return {.method = "POST", .target = "/x", .headers = {{"X-Test", "1"}}, .body = std::move(body)};
}

TEST(UpstreamClientTest, WholeResponseAndKeepAliveReuse) {
  FakeServer server([](const net::http::Request& r, auto w) {
    w->send(201, "text/plain", "echo " + r.body + " " + r.header("x-test"), {{"X-Back", "b"}});
  });
  UpstreamClient client;
  for (int i = 0; i < 3; ++i) {
    Collector c;
    client.start("127.0.0.1", server.port(), post("b" + std::to_string(i)), c.callbacks(),
                 Deadline::after_ms(kWaitMs));
    Outcome o = c.wait();
    ASSERT_TRUE(o.done.is_ok()) << o.done.to_string();
    EXPECT_EQ(o.status, 201);
    EXPECT_EQ(o.headers["x-back"], "b");
    std::string body;
    for (auto& p : o.pieces) {
      body += p;
    }
    EXPECT_EQ(body, "echo b" + std::to_string(i) + " 1");
  }
  auto stats = client.stats();
  EXPECT_EQ(stats.num_connects, 1);
  EXPECT_EQ(stats.num_reuses, 2);
  EXPECT_EQ(stats.num_idle, 1);
  EXPECT_EQ(stats.num_in_flight, 0);
  EXPECT_EQ(server.num_open_connections(), 1);
}

TEST(UpstreamClientTest, HandsOverEachPieceAsItArrives) {
  auto first_seen = std::make_shared<Gate>();
  std::atomic<bool> server_waited{false};
  FakeServer server([](auto&&...) {});
  server.set_handler([&, first_seen](const net::http::Request&, auto w) {
    w->start_stream(200, "text/event-stream");
    w->write("one");
    server.spawn([&, first_seen, w] {
      server_waited = first_seen->wait(kWaitMs);
      w->write("two");
      w->end();
    });
  });
  UpstreamClient client;
  Collector c;
  c.on_piece = [first_seen](const std::string& piece) {
    if (piece == "one") {
      first_seen->open();
    }
  };
  client.start("127.0.0.1", server.port(), post("x"), c.callbacks(), Deadline::after_ms(kWaitMs));
  Outcome o = c.wait();
  ASSERT_TRUE(o.done.is_ok()) << o.done.to_string();
  EXPECT_TRUE(server_waited.load());
  EXPECT_EQ(o.pieces, (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(o.headers["content-type"], "text/event-stream");
}

TEST(UpstreamClientTest, CancelClosesTheConnectionAtOnce) {
  auto closed = std::make_shared<Gate>();
  FakeServer server([closed](const net::http::Request&, auto w) {
    w->on_close([closed] { closed->open(); });
    w->start_stream(200, "text/event-stream");
    w->write("partial");
  });
  UpstreamClient client;
  auto got_piece = std::make_shared<Gate>();
  Collector c;
  c.on_piece = [got_piece](const std::string&) { got_piece->open(); };
  auto call = client.start("127.0.0.1", server.port(), post("x"), c.callbacks(),
                           Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(got_piece->wait(kWaitMs));
  call->cancel();
  Outcome o = c.wait();
  EXPECT_EQ(o.done.code(), StatusCode::kCancelled);
  EXPECT_TRUE(closed->wait(kWaitMs)) << "the server never saw the connection close";
  call->cancel();  // a second cancel is harmless
  EXPECT_EQ(client.stats().num_idle, 0);
}

TEST(UpstreamClientTest, DeadlineEndsASilentCall) {
  FakeServer server([](const net::http::Request&, auto) {});  // never answers
  UpstreamClient client;
  Collector c;
  auto started = std::chrono::steady_clock::now();
  client.start("127.0.0.1", server.port(), post("x"), c.callbacks(), Deadline::after_ms(200));
  Outcome o = c.wait();
  EXPECT_EQ(o.done.code(), StatusCode::kDeadlineExceeded) << o.done.to_string();
  EXPECT_NE(o.done.message().find("127.0.0.1:" + std::to_string(server.port())), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(UpstreamClientTest, RefusedAndUnresolvableAreUnavailable) {
  int port = 0;
  {
    FakeServer gone([](const net::http::Request&, auto) {});
    port = gone.port();
  }
  UpstreamClient client;
  Collector refused;
  client.start("127.0.0.1", port, post("x"), refused.callbacks(), Deadline::after_ms(kWaitMs));
  Outcome o = refused.wait();
  EXPECT_EQ(o.done.code(), StatusCode::kUnavailable);
  EXPECT_NE(o.done.message().find("cannot connect to 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << o.done.message();

  Collector unknown;
  client.start("no-such-host.invalid", 80, post("x"), unknown.callbacks(),
               Deadline::after_ms(kWaitMs));
  o = unknown.wait();
  EXPECT_EQ(o.done.code(), StatusCode::kUnavailable) << o.done.to_string();
}

TEST(UpstreamClientTest, IdleConnectionClosedByTheServerIsNotReused) {
  net::http::ServerOptions options;
  FakeServer server([](const net::http::Request&, auto w) { w->send(200, "text/plain", "ok"); });
  UpstreamClientOptions client_options;
  client_options.max_idle_ms = 50;  // older idle connections are not trusted
  UpstreamClient client(client_options);
  for (int i = 0; i < 2; ++i) {
    Collector c;
    client.start("127.0.0.1", server.port(), post("x"), c.callbacks(), Deadline::after_ms(kWaitMs));
    EXPECT_TRUE(c.wait().done.is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(client.stats().num_connects, 2);
}

TEST(UpstreamClientTest, ServerThatClosedAnIdleConnectionGetsANewOne) {
  // The raw server answers one request per connection, with keep-alive, then closes it: the
  // pooled connection is dead when the next call takes it.
  testing::RawServer server([](const net::Fd& fd, const std::string&) {
    std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok";
    (void)net::write_all(fd, answer.data(), answer.size(), Deadline::after_ms(kWaitMs));
  });
  UpstreamClient client;
  for (int i = 0; i < 3; ++i) {
    Collector c;
    client.start("127.0.0.1", server.port(), post("x"), c.callbacks(), Deadline::after_ms(kWaitMs));
    Outcome o = c.wait();
    ASSERT_TRUE(o.done.is_ok()) << o.done.to_string();
    EXPECT_EQ(o.pieces, std::vector<std::string>{"ok"});
  }
  EXPECT_EQ(server.num_requests(), 3);
}

TEST(UpstreamClientTest, ShutdownEndsCallsInFlight) {
  auto closed = std::make_shared<Gate>();
  FakeServer server(
      [closed](const net::http::Request&, auto w) { w->on_close([closed] { closed->open(); }); });
  auto client = std::make_unique<UpstreamClient>();
  Collector c;
  client->start("127.0.0.1", server.port(), post("x"), c.callbacks(), Deadline::after_ms(kWaitMs));
  ASSERT_TRUE(server.wait_for_requests("/x", 1, kWaitMs));
  client.reset();
  Outcome o = c.wait();
  EXPECT_EQ(o.done.code(), StatusCode::kCancelled);
  EXPECT_TRUE(closed->wait(kWaitMs));
}

}  // namespace
}  // namespace crescent::proxy
