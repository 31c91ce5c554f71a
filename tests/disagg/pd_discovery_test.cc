// The proxy following cluster members in etcd (docs/deployment.md, "Discovery"): a real etcd, a
// prefill worker (P) and a decode worker (D1) started with `--cluster etcd://.../c1` and a 3 s
// lease, and `crescent proxy --discover etcd://.../c1` with no --prefill or --decode. A
// completion works; a second decode worker (D2) started later gets requests without restarting
// the proxy; D1 killed with SIGKILL leaves the proxy's members within about the lease ttl, and
// completions go on succeeding.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "testing/etcd_process.h"

namespace crescent::testing {
namespace {

constexpr double kLeaseTtlS = 3;

class PdDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdProcess::start();
    ASSERT_TRUE(etcd.is_ok()) << etcd.status().to_string();
    etcd_ = std::move(etcd).value();
    cluster_ = etcd_->url("/c1");
    ServeSpec p;
    p.role = "prefill";
    p.port = free_port();
    p.bootstrap_addr = etcd_->url("/p0");
    p.kv_transfer_timeout_s = 60;
    p.extra_args = {"--bootstrap-lease-ttl", "3", "--cluster", cluster_};
    auto prefill = launch_serve("P", p);
    ASSERT_TRUE(prefill.is_ok()) << prefill.status().to_string();
    pd_.prefill = std::move(*prefill);
    auto d1 = launch_serve("D1", decode_spec());
    ASSERT_TRUE(d1.is_ok()) << d1.status().to_string();
    pd_.decode = std::move(*d1);
    Status ready = wait_ready(&pd_.prefill, false);
    ASSERT_TRUE(ready.is_ok()) << ready.to_string();
    ready = wait_ready(&pd_.decode, false);
    ASSERT_TRUE(ready.is_ok()) << ready.to_string();
    auto proxy = start_proxy_with({"--discover", cluster_});
    ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string() << pd_.outputs();
    pd_.proxy = std::move(*proxy);
  }
  void TearDown() override {
    std::string problems = pd_.stop_all();
    EXPECT_TRUE(problems.empty()) << problems;
    if (d2_.process) {
      d2_.process->kill_now();
    }
    if (HasFailure()) {
      std::string out = pd_.outputs() + d2_.output() + (etcd_ ? etcd_->log() : "");
      std::printf("---- process output (last 8000 bytes) ----\n%s\n",
                  (out.size() > 8000 ? out.substr(out.size() - 8000) : out).c_str());
    }
  }
  ServeSpec decode_spec() {
    ServeSpec d;
    d.role = "decode";
    d.port = free_port();  // --cluster advertises http://127.0.0.1:PORT
    d.kv_transfer_timeout_s = 60;
    d.extra_args = {"--bootstrap-lease-ttl", "3", "--cluster", cluster_};
    return d;
  }
  Reply through_proxy(int seed) {
    return send(pd_.proxy.port, "/v1/completions",
                completion("member number " + std::to_string(seed) + " says hello", 4));
  }
  double proxy_decode_members() {
    return metric_sum(read_metrics(pd_.proxy.port), "crescent_proxy_discovered_members",
                      {"role=\"decode\""});
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::string cluster_;
  PdPair pd_;
  Node d2_;
};

TEST_F(PdDiscoveryTest, DecodeWorkersJoinAndLeaveWithoutRestartingTheProxy) {
  Reply first = through_proxy(0);
  ASSERT_TRUE(first.is_ok()) << first.describe();
  EXPECT_EQ(proxy_decode_members(), 1);

  // D2 joins: the proxy's round-robin reaches it without a restart.
  auto d2 = start_serve("D2", decode_spec());
  ASSERT_TRUE(d2.is_ok()) << d2.status().to_string();
  d2_ = std::move(*d2);
  auto deadline = Deadline::after_ms(slack_ms(15'000));
  int seed = 1;
  double d2_tokens = 0;
  while (d2_tokens <= 0 && !deadline.is_expired()) {
    Reply r = through_proxy(seed++);
    ASSERT_TRUE(r.is_ok()) << "while D2 joins: " << r.describe();
    d2_tokens = metric_sum(read_metrics(d2_.port), "crescent_generation_tokens_total");
  }
  EXPECT_GT(d2_tokens, 0) << "D2 never got a request through the proxy";
  EXPECT_EQ(proxy_decode_members(), 2);

  // D1 dies: its key expires with its lease and it leaves the proxy's members.
  pd_.decode.process->kill_now();
  auto killed_at = std::chrono::steady_clock::now();
  deadline = Deadline::after_ms(slack_ms(20'000));
  while (proxy_decode_members() != 1 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double to_leave_s = seconds_since(killed_at);
  std::printf("discovery: killed D1 left the proxy's members %.2f s after SIGKILL (ttl %.0f s)\n",
              to_leave_s, kLeaseTtlS);
  ASSERT_EQ(proxy_decode_members(), 1);
  EXPECT_LT(to_leave_s, slack_ms((kLeaseTtlS + 3) * 1000) / 1000.0);
  pd_.decode = std::move(d2_);
  d2_ = Node{};
  for (int i = 0; i < 6; ++i) {
    Reply r = through_proxy(100 + i);
    EXPECT_TRUE(r.is_ok()) << "after D1 left: " << r.describe();
  }
}

}  // namespace
}  // namespace crescent::testing
