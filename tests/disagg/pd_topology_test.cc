// Deployment shapes beyond one prefill and one decode process hosting their own bootstrap:
// a standalone `crescent bootstrap` that the prefill registers with (--bootstrap-addr), and a
// prefill process with two data-parallel ranks, where the proxy's X-data-parallel-rank header
// must reach the rank whose engine id it gave the decode side; and a prefill whose bootstrap
// server is not up, which must still stop at once on SIGTERM.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "net/http/http_client.h"

namespace crescent::testing {
namespace {

json completion(int i, int max_tokens, bool stream) {
  std::string prompt = "request " + std::to_string(i) + ":";
  for (int w = 0; w < 20 + 9 * (i % 4); ++w) {
    prompt += " token" + std::to_string((w * 13 + i) % 50);
  }
  return crescent::testing::completion(prompt, max_tokens, stream);
}

// Sends n requests through the proxy, 4 at a time; every one must succeed.
void expect_requests_succeed(const PdPair& pd, int n) {
  std::vector<Reply> replies(n);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        replies[i] = send(pd.proxy.port, "/v1/completions", completion(i, 5, i % 2 == 1));
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(replies[i].is_ok()) << "request " << i << ": " << replies[i].describe();
    EXPECT_EQ(replies[i].usage_of("completion_tokens"), 5) << replies[i].describe();
  }
  EXPECT_EQ(wait_blocks_used(pd.prefill.port, 0, Deadline::after_ms(15'000)), 0);
  EXPECT_EQ(wait_blocks_used(pd.decode.port, 0, Deadline::after_ms(15'000)), 0);
}

void print_on_failure(const PdPair& pd, const Node* extra = nullptr) {
  if (::testing::Test::HasFailure()) {
    std::string out = pd.outputs() + (extra ? extra->output() : "");
    std::printf("---- process output (last 8000 bytes) ----\n%s\n",
                (out.size() > 8000 ? out.substr(out.size() - 8000) : out).c_str());
  }
}

TEST(PdTopologyTest, ExternalBootstrapServer) {
  auto bootstrap = start_bootstrap(0);
  ASSERT_TRUE(bootstrap.is_ok()) << bootstrap.status().to_string();
  ServeSpec p;
  p.bootstrap_addr = bootstrap->bootstrap_url();
  ServeSpec d;
  auto pd = start_pd(p, d, /*with_proxy=*/false);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  EXPECT_EQ(pd->prefill.bootstrap_port, 0) << "the prefill hosts a bootstrap of its own";
  // The proxy reads the external bootstrap.
  pd->prefill.bootstrap_port = bootstrap->port;
  auto proxy = start_proxy(pd->prefill, pd->decode);
  ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string();
  pd->proxy = std::move(*proxy);
  expect_requests_succeed(*pd, 6);
  std::string problems = pd->stop_all();
  EXPECT_TRUE(problems.empty()) << problems;
  print_on_failure(*pd, &*bootstrap);
}

TEST(PdTopologyTest, TwoDataParallelPrefillRanks) {
  ServeSpec p;
  p.extra_args = {"--data-parallel-size", "2"};
  ServeSpec d;
  auto pd = start_pd(p, d, /*with_proxy=*/true);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  // Both ranks are registered, with different engine ids.
  net::http::HttpClient client("127.0.0.1", pd->prefill.bootstrap_port);
  auto r = client.request("GET", "/query", "", {}, Deadline::after_ms(5000));
  ASSERT_TRUE(r.is_ok() && r->status == 200);
  json q = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(q.is_object() && q.contains("0") && q.contains("1")) << r->body;
  EXPECT_NE(q["0"]["engine_id"], q["1"]["engine_id"]) << r->body;
  // Round-robin over the ranks: every request's prefill half lands on the rank D asks.
  expect_requests_succeed(*pd, 8);
  std::string problems = pd->stop_all();
  EXPECT_TRUE(problems.empty()) << problems;
  print_on_failure(*pd);
}

// A prefill worker whose bootstrap server is not up retries its registration for a minute;
// SIGTERM in that time ends it at once (nothing is in flight before it is ready).
TEST(PdTopologyTest, PrefillWaitingForItsBootstrapStopsAtOnceOnSigterm) {
  ServeSpec p;
  p.role = "prefill";
  p.bootstrap_addr = "http://127.0.0.1:" + std::to_string(free_port());
  auto node = launch_serve("prefill", p);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  ChildProcess& process = *node->process;
  auto deadline = Deadline::after(std::chrono::seconds(start_timeout_s()));
  while (process.output().find("cannot register with") == std::string::npos &&
         !deadline.is_expired() && process.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(process.output().find("cannot register with " + p.bootstrap_addr), std::string::npos)
      << process.output();
  auto sent = std::chrono::steady_clock::now();
  process.signal(SIGTERM);
  EXPECT_EQ(process.wait_exit(Deadline::after_ms(10'000)), 0) << process.output();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(5));
  process.wait_drained();
  EXPECT_NE(process.output().find("SIGTERM before ready, exiting"), std::string::npos)
      << process.output();
}

}  // namespace
}  // namespace crescent::testing
