// `crescent proxy --router kv_aware` over two real prefill servers and one decode server on the
// tiny model: prompts sharing a long prefix go to the prefill whose prefix cache holds it (the
// proxy learns that from the prefills' /v1/kv_events), and a prefill that is killed leaves the
// proxy's KV index at once while requests keep succeeding on the other.

#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"

namespace crescent::testing {
namespace {

// ~60 words: several full 16-token blocks of the tiny model's tokenizer.
std::string shared_prefix() {
  std::string s;
  for (int i = 0; i < 60; ++i) {
    s += "word" + std::to_string(i % 7) + " ";
  }
  return s;
}

double prompt_tokens(const Node& node) {
  return metric_sum(read_metrics(node.port), "crescent_prompt_tokens_total");
}

TEST(PdRouterTest, SharedPrefixGoesToItsHolderAndAKilledPrefillLeavesTheIndex) {
  ServeSpec p;
  p.role = "prefill";
  ServeSpec d;
  d.role = "decode";
  auto p0 = launch_serve("prefill0", p);
  auto p1 = launch_serve("prefill1", p);
  auto dec = launch_serve("decode", d);
  ASSERT_TRUE(p0.is_ok() && p1.is_ok() && dec.is_ok());
  ASSERT_TRUE(wait_ready(&*p0, true).is_ok()) << p0->output();
  ASSERT_TRUE(wait_ready(&*p1, true).is_ok()) << p1->output();
  ASSERT_TRUE(wait_ready(&*dec).is_ok()) << dec->output();
  auto proxy = ChildProcess::start(
      "proxy", {"proxy", "--host", "127.0.0.1", "--port", "0", "--prefill", p0->url(),
                std::to_string(p0->bootstrap_port), "--prefill", p1->url(),
                std::to_string(p1->bootstrap_port), "--decode", dec->url(), "--router", "kv_aware",
                "--router-poll-interval-ms", "50", "--router-load-weight", "0.5"});
  ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string();
  auto deadline = Deadline::after(std::chrono::seconds(start_timeout_s()));
  auto port = (*proxy)->wait_for_port(deadline);
  ASSERT_TRUE(port.is_ok()) << (*proxy)->output();
  ASSERT_TRUE((*proxy)->wait_healthy(*port, deadline).is_ok()) << (*proxy)->output();

  const std::string prefix = shared_prefix();
  Reply first = send(*port, "/v1/completions", completion(prefix + "first", 2));
  ASSERT_TRUE(first.is_ok()) << first.describe() << (*proxy)->output();
  // The holder is the prefill that computed the prompt.
  const bool holder_is_0 = prompt_tokens(*p0) > 0;
  Node& holder = holder_is_0 ? *p0 : *p1;
  Node& other = holder_is_0 ? *p1 : *p0;
  // Once the proxy read the holder's events, the prefix goes there every time.
  ASSERT_GE(wait_metric_at_least(*port, "crescent_proxy_router_index_entries", {}, 2,
                                 Deadline::after_ms(10'000)),
            2);
  const double other_before = prompt_tokens(other);
  const int n = scaled(6, 3);
  for (int i = 0; i < n; ++i) {
    Reply r = send(*port, "/v1/completions", completion(prefix + "suffix " + std::to_string(i), 2));
    ASSERT_TRUE(r.is_ok()) << r.describe();
  }
  EXPECT_EQ(prompt_tokens(other), other_before);
  auto m = read_metrics(*port);
  EXPECT_GE(metric_sum(m, "crescent_proxy_router_decisions_total", {"reason=\"prefix_hit\""}), n);
  EXPECT_GT(metric_sum(m, "crescent_proxy_router_matched_blocks_total"), 0);
  EXPECT_GT(metric_sum(read_metrics(holder.port), "crescent_prefix_cache_hits_total"), 0);

  // Kill the holder: its hashes leave the index, and the prefix goes to the other prefill.
  const double entries_before = metric_sum(m, "crescent_proxy_router_index_entries");
  holder.process->kill_now();
  bool dropped = false;
  for (auto until = Deadline::after_ms(10'000); !until.is_expired();) {
    if (metric_sum(read_metrics(*port), "crescent_proxy_router_index_entries") < entries_before) {
      dropped = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(dropped) << (*proxy)->output();
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    ok +=
        send(*port, "/v1/completions", completion(prefix + "after " + std::to_string(i), 2)).is_ok()
            ? 1
            : 0;
  }
  EXPECT_GE(ok, n - 1);  // at most the one that found the holder dead
  EXPECT_GT(prompt_tokens(other), other_before);
  (*proxy)->signal(SIGTERM);
  EXPECT_EQ((*proxy)->wait_exit(Deadline::after_ms(30'000)), 0) << (*proxy)->output();
}

}  // namespace
}  // namespace crescent::testing
