// Registrations as leases with real processes (docs/bootstrap.md): a standalone `crescent
// bootstrap`, a prefill worker (P) registered there with a short --bootstrap-lease-ttl, a
// decode worker (D) and the proxy. P is killed with SIGKILL and started again with the same
// flags: it takes its dp rank back (the old owner does not answer), the epoch goes up, and
// requests through the proxy succeed again within a few seconds. A P that was frozen past
// its lease and replaced is fenced when it wakes: /health 503 and crescent_bootstrap_fenced 1.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "net/http/http_client.h"
#include "tests/testing/health_poll.h"

namespace crescent::testing {
namespace {

constexpr double kLeaseTtlS = 2;

class PdLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = start_bootstrap(0);
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    bootstrap_ = std::move(*b);
    prefill_spec_.role = "prefill";
    prefill_spec_.port = free_port();
    prefill_spec_.bootstrap_addr = bootstrap_.bootstrap_url();
    prefill_spec_.extra_args = {"--bootstrap-lease-ttl", "2"};
    decode_spec_.role = "decode";
  }
  void TearDown() override {
    std::string problems = pd_.stop_all();
    if (old_prefill_.process && old_prefill_.process->is_running()) {
      old_prefill_.process->signal(SIGCONT);
      old_prefill_.process->kill_now();
    }
    if (bootstrap_.process) {
      EXPECT_EQ(bootstrap_.process->terminate(Deadline::after_ms(10'000)), 0);
    }
    EXPECT_TRUE(problems.empty()) << problems;
    if (HasFailure()) {
      std::string out = pd_.outputs() + old_prefill_.output() + bootstrap_.output();
      std::printf("---- process output (last 8000 bytes) ----\n%s\n",
                  (out.size() > 8000 ? out.substr(out.size() - 8000) : out).c_str());
    }
  }
  // The bootstrap's dp rank 0 entry (engine_id, epoch), or null with the reason in *error.
  json rank0(std::string* error) {
    net::http::HttpClient http("127.0.0.1", bootstrap_.port);
    auto r = http.request("GET", "/query", "", {}, Deadline::after_ms(5000));
    if (!r.is_ok() || r->status != 200) {
      *error = r.is_ok() ? r->body : r.status().to_string();
      return json();
    }
    return json::parse(r->body)["0"];
  }
  Reply through_proxy(int seed) {
    return send(pd_.proxy.port, "/v1/completions",
                completion("lease test prompt number " + std::to_string(seed), 4));
  }

  Node bootstrap_;
  Node old_prefill_;  // a frozen P that was replaced
  ServeSpec prefill_spec_;
  ServeSpec decode_spec_;
  PdPair pd_;
};

TEST_F(PdLeaseTest, PrefillKilledAndRestartedServesAgainThroughTheProxy) {
  auto pd = start_pd(prefill_spec_, decode_spec_, false);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  pd_ = std::move(*pd);
  pd_.prefill.bootstrap_port = bootstrap_.port;  // the proxy reads the standalone bootstrap
  auto proxy = start_proxy(pd_.prefill, pd_.decode);
  ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string();
  pd_.proxy = std::move(*proxy);
  Reply before = through_proxy(1);
  ASSERT_TRUE(before.is_ok()) << before.describe();
  std::string error;
  json first = rank0(&error);
  ASSERT_TRUE(first.is_object()) << error;
  EXPECT_EQ(first["epoch"], 1);
  const std::string old_engine = first["engine_id"];

  pd_.prefill.process->kill_now();
  // Restarted at once with the same flags, as systemd or Kubernetes would: the old
  // registration's lease still runs, but nothing answers at its address any more.
  auto restarted_at = std::chrono::steady_clock::now();
  auto p2 = start_serve("P2", prefill_spec_);
  ASSERT_TRUE(p2.is_ok()) << "the restarted P did not start (a crash loop): "
                          << p2.status().to_string();
  pd_.prefill = std::move(*p2);
  pd_.prefill.bootstrap_port = bootstrap_.port;
  json second = rank0(&error);
  ASSERT_TRUE(second.is_object()) << error;
  EXPECT_EQ(second["epoch"], 2);
  EXPECT_NE(second["engine_id"], old_engine);

  // Through the proxy, which follows the new engine id on its next poll of the bootstrap.
  Reply after;
  auto deadline = Deadline::after_ms(slack_ms(10'000));
  int seed = 2;
  do {
    after = through_proxy(seed++);
    if (!after.is_ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } while (!after.is_ok() && !deadline.is_expired());
  EXPECT_TRUE(after.is_ok()) << "proxied request after P restarted: " << after.describe();
  double to_serving_s = seconds_since(restarted_at);
  std::printf("restarted P serving through the proxy %.2f s after its start (lease ttl %.0f s)\n",
              to_serving_s, kLeaseTtlS);
  // A decode request naming the dead engine fails clearly instead of waiting.
  Reply stale = send(pd_.decode.port, "/v1/completions",
                     decode_body(completion("stale engine id", 2), "xfer-lease-stale",
                                 bootstrap_.bootstrap_url(), old_engine));
  EXPECT_FALSE(stale.is_ok()) << stale.describe();
  EXPECT_NE(stale.error_message.find(old_engine), std::string::npos) << stale.describe();
  // The new P keeps its lease well past the ttl.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(kLeaseTtlS * 1500)));
  json later = rank0(&error);
  ASSERT_TRUE(later.is_object()) << "the restarted P's lease lapsed: " << error;
  EXPECT_EQ(later["engine_id"], second["engine_id"]);
  EXPECT_TRUE(through_proxy(100).is_ok());
}

TEST_F(PdLeaseTest, FrozenPrefillIsReplacedAfterItsLeaseAndFencedWhenItWakes) {
  auto p1 = start_serve("P1", prefill_spec_);
  ASSERT_TRUE(p1.is_ok()) << p1.status().to_string();
  old_prefill_ = std::move(*p1);
  std::string error;
  json first = rank0(&error);
  ASSERT_TRUE(first.is_object()) << error;
  // Frozen: its sockets still accept connections, but it renews nothing.
  old_prefill_.process->signal(SIGSTOP);
  // While its lease runs, a newcomer is refused naming both engines (sent at once, as a
  // worker would: a whole process might start after the lease lapsed).
  const std::string old_engine = first["engine_id"];
  net::http::HttpClient b("127.0.0.1", bootstrap_.port);
  auto refused = b.request("POST", "/register",
                           json{{"engine_id", "intruder"},
                                {"dp_rank", 0},
                                {"tp_rank", 0},
                                {"pp_rank", 0},
                                {"addr", "tcp://127.0.0.1:1"},
                                {"lease_ttl_s", kLeaseTtlS}}
                               .dump(),
                           {{"Content-Type", "application/json"}}, Deadline::after_ms(5000));
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_NE(refused->body.find("registered by engine_id '" + old_engine + "', not 'intruder'"),
            std::string::npos)
      << refused->body;
  ServeSpec again = prefill_spec_;
  again.port = free_port();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(kLeaseTtlS * 1100)));
  auto p2 = start_serve("P2", again);
  ASSERT_TRUE(p2.is_ok()) << p2.status().to_string();
  pd_.prefill = std::move(*p2);
  json second = rank0(&error);
  ASSERT_TRUE(second.is_object()) << error;
  EXPECT_EQ(second["epoch"], 2);

  old_prefill_.process->signal(SIGCONT);
  net::http::HttpClient http("127.0.0.1", old_prefill_.port);
  const HealthAnswer health =
      poll_health(old_prefill_.port, 503,
                  Deadline::after_ms(slack_ms(static_cast<int64_t>(kLeaseTtlS * 1000) + 3000)));
  EXPECT_EQ(health.status, 503) << "the fenced P still says it is healthy";
  EXPECT_NE(health.body.find("fenced out at the bootstrap"), std::string::npos) << health.body;
  auto fenced_answer =
      http.request("POST", "/v1/completions", R"({"model":"m","prompt":"hi","max_tokens":1})",
                   {{"Content-Type", "application/json"}}, Deadline::after_ms(5000));
  ASSERT_TRUE(fenced_answer.is_ok()) << fenced_answer.status().to_string();
  EXPECT_EQ(fenced_answer->status, 503);
  EXPECT_NE(fenced_answer->body.find("out of service: fenced out"), std::string::npos)
      << fenced_answer->body;
  EXPECT_EQ(metric_sum(read_metrics(old_prefill_.port), "crescent_bootstrap_fenced"), 1);
  // The log line is written when P notices, and it reaches the test through a pipe drained by
  // another thread: wait for it rather than read the output once (seen missing under load).
  const auto logged = [&](const std::string& text) {
    const Deadline until = Deadline::after_ms(slack_ms(5000));
    while (old_prefill_.output().find(text) == std::string::npos && !until.is_expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return old_prefill_.output().find(text) != std::string::npos;
  };
  EXPECT_TRUE(logged("fenced out, no longer serving")) << old_prefill_.output();
  EXPECT_TRUE(logged(second["engine_id"].get<std::string>())) << old_prefill_.output();
  // The new P serves.
  EXPECT_EQ(metric_sum(read_metrics(pd_.prefill.port), "crescent_bootstrap_fenced"), 0);
  EXPECT_EQ(old_prefill_.process->terminate(Deadline::after_ms(10'000)), 0);
}

}  // namespace
}  // namespace crescent::testing
