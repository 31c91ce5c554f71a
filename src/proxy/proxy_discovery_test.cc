// ProxyServer with --discover against a real etcd (tests/testing/etcd_process.h: fails, never
// skips, when the binary is missing) and fake prefill, bootstrap and decode servers: members
// published with MemberPublisher join and leave the rotation; a --decode server that is also a
// member stays when its key goes.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "bootstrap/etcd_members.h"
#include "net/http/http_client.h"
#include "proxy/fake_upstreams.h"
#include "proxy/proxy_server.h"
#include "tests/testing/etcd_process.h"

namespace crescent::proxy {
namespace {

using bootstrap::ClusterMember;
using bootstrap::MemberPublisher;
using testing::FakeServer;

// A fake decode server that counts the completions it got.
struct CountingDecode {
  CountingDecode()
      : server([this](const net::http::Request& r, std::shared_ptr<net::http::ResponseWriter> w) {
          if (r.method == "POST") {
            num_completions.fetch_add(1);
          }
          handler(r, std::move(w));
        }) {
    handler = testing::decode_handler(&server);
  }
  std::atomic<int> num_completions{0};
  FakeServer::Handler handler;  // set before any request can arrive (nothing knows the port)
  FakeServer server;
};

bool wait_for(const std::function<bool()>& done, int64_t ms = 10'000) {
  auto deadline = Deadline::after_ms(ms);
  while (!done()) {
    if (deadline.is_expired()) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(ProxyDiscoveryTest, MembersJoinAndLeaveTheRotation) {
  auto etcd = crescent::testing::EtcdProcess::start();
  ASSERT_TRUE(etcd.is_ok()) << etcd.status().to_string();
  const std::string cluster = (*etcd)->url("/c");
  FakeServer prefill(testing::prefill_handler());
  FakeServer prefill_bootstrap(testing::bootstrap_handler({"engine-p"}));
  CountingDecode d0;  // on the command line, and a member too
  CountingDecode d1;  // a member only

  ProxyOptions options;
  options.port = 0;
  options.poll_interval_ms = 20;
  options.refresh_interval_ms = 100;
  options.discover_url = cluster;
  options.discover_interval_ms = 50;
  options.decodes.push_back(*parse_upstream_url(d0.server.url()));
  auto started = ProxyServer::start(options);
  ASSERT_TRUE(started.is_ok()) << started.status().to_string();
  std::unique_ptr<ProxyServer> proxy = std::move(started).value();
  EXPECT_FALSE(proxy->is_ready());  // no prefill yet

  auto publish = [&](const std::string& role, const std::string& url, const std::string& b,
                     const std::string& id) {
    auto p = MemberPublisher::start(
        cluster, ClusterMember{.url = url, .role = role, .bootstrap = b, .engine_id = id}, 5);
    CRESCENT_CHECK(p.is_ok()) << p.status().to_string();
    return std::move(p).value();
  };
  auto p = publish("prefill", prefill.url(),
                   "http://127.0.0.1:" + std::to_string(prefill_bootstrap.port()), "p");
  ASSERT_TRUE(wait_for([&] { return proxy->is_ready(); })) << "the prefill member never joined";
  auto m0 = publish("decode", d0.server.url(), "", "d0");
  auto m1 = publish("decode", d1.server.url(), "", "d1");

  net::http::HttpClient client("127.0.0.1", proxy->port());
  auto complete = [&] {
    auto r = client.request("POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})",
                            {{"Content-Type", "application/json"}}, Deadline::after_ms(10'000));
    return r.is_ok() ? r->status : -1;
  };
  ASSERT_TRUE(wait_for([&] {
    EXPECT_EQ(complete(), 200);
    return d1.num_completions.load() > 0;
  })) << "the decode member never got a request";

  // d1 leaves (its worker stopped): nothing more reaches it.
  m1->stop();
  ASSERT_TRUE(wait_for([&] {
    auto metrics = client.request("GET", "/metrics", "", {}, Deadline::after_ms(5000));
    return metrics.is_ok() &&
           metrics->body.find("crescent_proxy_discovered_members{role=\"decode\"} 1") !=
               std::string::npos;
  }));
  const int d1_before = d1.num_completions.load();
  // d0's key goes too: it stays, being on the command line.
  m0->stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(complete(), 200);
  }
  EXPECT_EQ(d1.num_completions.load(), d1_before);
  EXPECT_GE(d0.num_completions.load(), 6);

  // The prefill leaves: not ready, completions get 503 naming what is awaited.
  p->stop();
  ASSERT_TRUE(wait_for([&] { return !proxy->is_ready(); }));
  EXPECT_EQ(complete(), 503);

  // etcd gone: the last set stays, /health says so.
  p = publish("prefill", prefill.url(),
              "http://127.0.0.1:" + std::to_string(prefill_bootstrap.port()), "p2");
  ASSERT_TRUE(wait_for([&] { return proxy->is_ready(); }));
  (*etcd)->kill_now();
  ASSERT_TRUE(wait_for([&] {
    auto health = client.request("GET", "/health", "", {}, Deadline::after_ms(5000));
    return health.is_ok() && health->status == 200 &&
           health->body.find("etcd unreachable") != std::string::npos;
  }));
  EXPECT_EQ(complete(), 200);
  p.reset();  // its revocation fails fast: etcd is gone
  proxy->stop();
}

}  // namespace
}  // namespace crescent::proxy
