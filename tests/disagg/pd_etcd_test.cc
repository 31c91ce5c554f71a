// etcd as the discovery backend with real processes (docs/bootstrap.md, "etcd"): a real etcd
// started by the test, a prefill worker (P) registered in it with `--bootstrap-addr
// etcd://127.0.0.1:PORT/p0` and a short lease, a decode worker (D), and the proxy reading P's
// engine ids from etcd (`--prefill URL etcd://...`); D resolves P's engine through etcd.
// P killed with SIGKILL and started again: serving through the proxy again within 2x the lease
// ttl (3 s here), with a higher epoch, no human action. D killed: P's held blocks back at 0 within
// 2 s.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "bootstrap/bootstrap_client.h"
#include "core/ids.h"
#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "testing/etcd_process.h"

namespace crescent::testing {
namespace {

constexpr double kLeaseTtlS = 3;

std::string prompt(int num_words, int seed) {
  std::string s;
  for (int i = 0; i < num_words; ++i) {
    s += (i ? " " : "") + std::string("word") + std::to_string((i * 31 + seed) % 97);
  }
  return s;
}

class PdEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdProcess::start();
    ASSERT_TRUE(etcd.is_ok()) << etcd.status().to_string();
    etcd_ = std::move(etcd).value();
    etcd_url_ = etcd_->url("/p0");
    prefill_spec_.role = "prefill";
    prefill_spec_.port = free_port();
    prefill_spec_.bootstrap_addr = etcd_url_;
    prefill_spec_.kv_transfer_timeout_s = 60;
    prefill_spec_.extra_args = {"--bootstrap-lease-ttl", "3"};
    decode_spec_.role = "decode";
    decode_spec_.kv_transfer_timeout_s = 60;
    auto p = launch_serve("P", prefill_spec_);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    pd_.prefill = std::move(*p);
    auto d = launch_serve("D", decode_spec_);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    pd_.decode = std::move(*d);
    Status ready = wait_ready(&pd_.prefill, false);
    ASSERT_TRUE(ready.is_ok()) << ready.to_string();
    ready = wait_ready(&pd_.decode, false);
    ASSERT_TRUE(ready.is_ok()) << ready.to_string();
    auto proxy =
        start_proxy_with({"--prefill", pd_.prefill.url(), etcd_url_, "--decode", pd_.decode.url()});
    ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string() << pd_.outputs();
    pd_.proxy = std::move(*proxy);
  }
  void TearDown() override {
    std::string problems = pd_.stop_all();
    EXPECT_TRUE(problems.empty()) << problems;
    if (HasFailure()) {
      std::string out = pd_.outputs() + (etcd_ ? etcd_->log() : "");
      std::printf("---- process output (last 8000 bytes) ----\n%s\n",
                  (out.size() > 8000 ? out.substr(out.size() - 8000) : out).c_str());
    }
  }
  // dp rank 0 of P's registrations in etcd, or nullopt (the reason in *error).
  std::optional<bootstrap::DpEntry> rank0(std::string* error) {
    auto table = bootstrap::query(etcd_url_, Deadline::after_ms(5000));
    if (!table.is_ok() || table->count(0) == 0) {
      *error = table.is_ok() ? "no dp rank 0" : table.status().to_string();
      return std::nullopt;
    }
    return table->at(0);
  }
  Reply through_proxy(int seed, int num_words = 8) {
    return send(pd_.proxy.port, "/v1/completions", completion(prompt(num_words, seed), 4));
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::string etcd_url_;
  ServeSpec prefill_spec_;
  ServeSpec decode_spec_;
  PdPair pd_;
};

TEST_F(PdEtcdTest, PrefillKilledAndRestartedServesAgainWithinTwiceTheTtl) {
  Reply before = through_proxy(1);
  ASSERT_TRUE(before.is_ok()) << before.describe();
  std::string error;
  auto first = rank0(&error);
  ASSERT_TRUE(first.has_value()) << error;
  EXPECT_GT(first->epoch, 0u);

  pd_.prefill.process->kill_now();
  // Restarted at once with the same flags, as systemd or Kubernetes would: the old key's lease
  // still runs; the new P waits for it to lapse, then takes dp rank 0.
  auto killed_at = std::chrono::steady_clock::now();
  auto p2 = start_serve("P2", prefill_spec_);
  ASSERT_TRUE(p2.is_ok()) << "the restarted P did not start: " << p2.status().to_string();
  pd_.prefill = std::move(*p2);
  double to_ready_s = seconds_since(killed_at);
  Reply after;
  auto deadline = Deadline::after_ms(slack_ms(20'000));
  int seed = 2;
  do {
    after = through_proxy(seed++);
    if (!after.is_ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } while (!after.is_ok() && !deadline.is_expired());
  ASSERT_TRUE(after.is_ok()) << "proxied request after P restarted: " << after.describe();
  double to_serving_s = seconds_since(killed_at);
  std::printf(
      "etcd: restarted P ready %.2f s and serving through the proxy %.2f s after the kill (lease "
      "ttl %.0f s)\n",
      to_ready_s, to_serving_s, kLeaseTtlS);
  EXPECT_LT(to_serving_s, slack_ms(2 * kLeaseTtlS * 1000) / 1000.0)
      << "not serving again within 2x the lease ttl";
  auto second = rank0(&error);
  ASSERT_TRUE(second.has_value()) << error;
  EXPECT_NE(second->engine_id, first->engine_id);
  EXPECT_GT(second->epoch, first->epoch);
  // A decode request naming the dead engine fails naming it instead of waiting.
  Reply stale = send(pd_.decode.port, "/v1/completions",
                     decode_body(completion("stale engine id", 2), "xfer-etcd-stale", etcd_url_,
                                 first->engine_id));
  EXPECT_FALSE(stale.is_ok()) << stale.describe();
  EXPECT_NE(stale.error_message.find(first->engine_id), std::string::npos) << stale.describe();
  // The new P keeps its lease well past the ttl.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(kLeaseTtlS * 1500)));
  auto later = rank0(&error);
  ASSERT_TRUE(later.has_value()) << "the restarted P's lease lapsed: " << error;
  EXPECT_EQ(later->engine_id, second->engine_id);
  EXPECT_TRUE(through_proxy(100).is_ok());
}

TEST_F(PdEtcdTest, DecodeKilledPrefillFreesItsBlocksWithinTwoSeconds) {
  Reply warm = through_proxy(7, 40);  // D is connected to P
  ASSERT_TRUE(warm.is_ok()) << warm.describe();
  // P holds KV for halves D has not asked for yet.
  for (int i = 0; i < 4; ++i) {
    Reply r = send(pd_.prefill.port, "/v1/completions",
                   prefill_body(completion(prompt(150, 50 + i), 4), "xfer-etcd-" + random_uuid()));
    ASSERT_TRUE(r.is_ok()) << "P's half: " << r.describe();
  }
  double held = blocks_used(pd_.prefill.port);
  EXPECT_GT(held, 0) << "P holds nothing";
  auto gone_at = std::chrono::steady_clock::now();
  pd_.decode.process->kill_now();
  EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, Deadline::after_ms(slack_ms(2000) + 5000)), 0)
      << "P kept " << held << " blocks";
  double freed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - gone_at).count();
  std::printf("etcd: P freed %.0f held blocks %.0f ms after D was killed\n", held, freed_ms);
  EXPECT_LE(freed_ms, slack_ms(2000));
}

// etcd gone: P cannot renew its lease and the proxy cannot read the engine ids, yet every
// process keeps serving with what it knows (P's engine id, D's resolved address), and the
// proxy says the prefill is not up in its metrics.
TEST_F(PdEtcdTest, EtcdDownKeepsServingWithWhatEveryProcessKnows) {
  Reply before = through_proxy(1);
  ASSERT_TRUE(before.is_ok()) << before.describe();
  etcd_->kill_now();
  // Past the lease ttl and several proxy polls.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(kLeaseTtlS * 1500)));
  for (int i = 0; i < 3; ++i) {
    Reply r = through_proxy(10 + i);
    EXPECT_TRUE(r.is_ok()) << "with etcd down: " << r.describe();
  }
  std::string error;
  auto m = read_metrics(pd_.proxy.port, &error);
  EXPECT_EQ(metric_sum(m, "crescent_proxy_prefill_ready", {}), 0) << error;
}

}  // namespace
}  // namespace crescent::testing
