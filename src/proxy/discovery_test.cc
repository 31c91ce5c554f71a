#include "proxy/discovery.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "bootstrap/etcd_members.h"
#include "proxy/prefill_registry.h"
#include "proxy/upstream_health.h"

namespace crescent::proxy {
namespace {

using bootstrap::MemberList;

ClusterMember decode(const std::string& id, const std::string& url) {
  return {.url = url, .role = "decode", .bootstrap = "", .engine_id = id};
}

ClusterMember prefill(const std::string& id, const std::string& url, const std::string& b) {
  return {.url = url, .role = "prefill", .bootstrap = b, .engine_id = id};
}

TEST(DiscoveryTest, DiffNamesJoinedAndLeftMembers) {
  std::vector<ClusterMember> before = {decode("d0", "http://h:1"), decode("d1", "http://h:2")};
  std::vector<ClusterMember> after = {decode("d1", "http://h:2"), decode("d2", "http://h:3")};
  MembershipChange c = diff_members(before, after);
  ASSERT_EQ(c.left.size(), 1u);
  EXPECT_EQ(c.left[0].engine_id, "d0");
  ASSERT_EQ(c.joined.size(), 1u);
  EXPECT_EQ(c.joined[0].engine_id, "d2");
  EXPECT_TRUE(diff_members(after, after).empty());
}

// A decode server killed and restarted on the same url: its new key appears while the old one
// waits for its lease to end. Neither the overlap nor the old key's expiry drops the url.
TEST(DiscoveryTest, ARestartOnTheSameUrlNeverLeaves) {
  const std::vector<ClusterMember> old_only = {decode("d0", "http://h:1")};
  const std::vector<ClusterMember> both = {decode("d0", "http://h:1"), decode("d9", "http://h:1")};
  const std::vector<ClusterMember> new_only = {decode("d9", "http://h:1")};
  EXPECT_TRUE(diff_members(old_only, both).empty());
  EXPECT_TRUE(diff_members(both, new_only).empty());
  EXPECT_TRUE(diff_members(old_only, new_only).empty());
  MembershipChange gone = diff_members(new_only, {});
  ASSERT_EQ(gone.left.size(), 1u);
  EXPECT_EQ(gone.left[0].url, "http://h:1");
  // A prefill restarted with another bootstrap is a new route.
  MembershipChange moved = diff_members({prefill("p0", "http://h:2", "etcd://e:1/a")},
                                        {prefill("p1", "http://h:2", "etcd://e:1/b")});
  EXPECT_EQ(moved.left.size(), 1u);
  EXPECT_EQ(moved.joined.size(), 1u);
}

TEST(DiscoveryTest, AChangedValueLeavesAndJoins) {
  MembershipChange c = diff_members({decode("d0", "http://h:1")}, {decode("d0", "http://h:9")});
  ASSERT_EQ(c.left.size(), 1u);
  ASSERT_EQ(c.joined.size(), 1u);
  EXPECT_EQ(c.left[0].url, "http://h:1");
  EXPECT_EQ(c.joined[0].url, "http://h:9");
}

TEST(DiscoveryTest, MemberValuesRoundTripAndBadOnesAreNamed) {
  ClusterMember p = prefill("e1", "http://10.0.0.1:8100", "etcd://10.0.0.9:2379/p1");
  auto back = bootstrap::parse_member_value(bootstrap::member_value(p));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(bootstrap::member_key("/c", p), "/c/members/prefill/e1");
  auto no_url = bootstrap::parse_member_value(R"({"role":"decode","engine_id":"x"})");
  ASSERT_FALSE(no_url.is_ok());
  EXPECT_NE(no_url.status().message().find("'url'"), std::string::npos);
  auto bad_role =
      bootstrap::parse_member_value(R"({"url":"http://h:1","role":"boss","engine_id":"x"})");
  ASSERT_FALSE(bad_role.is_ok());
  EXPECT_NE(bad_role.status().message().find("boss"), std::string::npos);
  auto no_bootstrap =
      bootstrap::parse_member_value(R"({"url":"http://h:1","role":"prefill","engine_id":"x"})");
  EXPECT_FALSE(no_bootstrap.is_ok());
}

TEST(DiscoveryTest, PrefillSpecOfAMember) {
  auto etcd = prefill_spec_of(prefill("e", "http://10.0.0.1:8100", "etcd://10.0.0.9:2379/p1"));
  ASSERT_TRUE(etcd.is_ok()) << etcd.status().message();
  EXPECT_EQ(etcd->etcd_url, "etcd://10.0.0.9:2379/p1");
  EXPECT_EQ(etcd->bootstrap_addr(), "etcd://10.0.0.9:2379/p1");
  auto http = prefill_spec_of(prefill("e", "http://10.0.0.1:8100", "http://10.0.0.1:8998"));
  ASSERT_TRUE(http.is_ok()) << http.status().message();
  EXPECT_EQ(http->bootstrap_port, 8998);
  EXPECT_EQ(http->bootstrap_addr(), "http://10.0.0.1:8998");
  auto elsewhere = prefill_spec_of(prefill("e", "http://10.0.0.1:8100", "http://10.0.0.2:8998"));
  EXPECT_FALSE(elsewhere.is_ok());
}

// A fake etcd: the members the next read returns, or an error.
struct FakeCluster {
  std::mutex mu;
  Result<MemberList> next = MemberList{};
  Result<MemberList> read() {
    std::lock_guard<std::mutex> lock(mu);
    return next;
  }
};

TEST(DiscoveryTest, WatcherAppliesChangesAndKeepsTheLastSetWhileEtcdIsDown) {
  FakeCluster cluster;
  std::vector<MembershipChange> changes;
  MemberWatcher watcher([&] { return cluster.read(); },
                        [&](const MembershipChange& c) { changes.push_back(c); }, 1000);
  cluster.next = MemberList{.members = {decode("d0", "http://h:1"), decode("d1", "http://h:2")}};
  watcher.poll_once();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].joined.size(), 2u);
  EXPECT_EQ(watcher.stats().num_decodes, 2);
  EXPECT_TRUE(watcher.stats().is_reachable);

  cluster.next = unavailable("etcd down");
  watcher.poll_once();
  EXPECT_EQ(changes.size(), 1u);  // nobody left
  EXPECT_FALSE(watcher.stats().is_reachable);
  EXPECT_EQ(watcher.stats().num_errors, 1u);
  EXPECT_EQ(watcher.stats().num_decodes, 2);
  EXPECT_NE(watcher.render_metrics().find("crescent_proxy_discovery_up 0"), std::string::npos);

  cluster.next = MemberList{.members = {decode("d1", "http://h:2")}};
  watcher.poll_once();
  ASSERT_EQ(changes.size(), 2u);
  ASSERT_EQ(changes[1].left.size(), 1u);
  EXPECT_EQ(changes[1].left[0].engine_id, "d0");
  EXPECT_TRUE(changes[1].joined.empty());
  EXPECT_TRUE(watcher.stats().is_reachable);
  EXPECT_NE(watcher.render_metrics().find("crescent_proxy_discovered_members{role=\"decode\"} 1"),
            std::string::npos);
}

TEST(DiscoveryTest, WatcherThreadPollsUntilStopped) {
  FakeCluster cluster;
  std::atomic<int> num_changes{0};
  MemberWatcher watcher([&] { return cluster.read(); },
                        [&](const MembershipChange&) { num_changes.fetch_add(1); }, 5);
  watcher.start();
  {
    std::lock_guard<std::mutex> lock(cluster.mu);
    cluster.next = MemberList{.members = {decode("d0", "http://h:1")}};
  }
  for (int i = 0; i < 400 && num_changes.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  watcher.stop();
  EXPECT_EQ(num_changes.load(), 1);
}

TEST(UpstreamHealthMembershipTest, AddAndRemoveKeepIndices) {
  UpstreamHealth h({"http://d0"}, {.base_backoff_ms = 100, .max_backoff_ms = 1000});
  const size_t d1 = h.add("http://d1");
  EXPECT_EQ(d1, 1u);
  EXPECT_EQ(h.add("http://d1"), 1u);  // already a member
  EXPECT_EQ(h.num_up(), 2);
  h.remove(0);
  EXPECT_FALSE(h.is_up(0));
  EXPECT_EQ(h.num_up(), 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h.next_up(), std::optional<size_t>(1));
  }
  ASSERT_EQ(h.states().size(), 1u);
  EXPECT_EQ(h.states()[0].url, "http://d1");
  // A removed server is never probed, even when it was down.
  h.report_unreachable(1, 0, "refused");
  h.remove(1);
  EXPECT_TRUE(h.take_due_probes(10'000).empty());
  EXPECT_EQ(h.describe_down(), "");
  EXPECT_FALSE(h.next_up().has_value());
  // Rejoining takes the old index back, in rotation.
  EXPECT_EQ(h.add("http://d0"), 0u);
  EXPECT_EQ(h.next_up(), std::optional<size_t>(0));
  EXPECT_EQ(h.size(), 2u);
}

TEST(PrefillRegistryMembershipTest, ARegistryWithNoPrefillWaitsAndDiscoveredOnesComeAndGo) {
  PrefillRegistry registry({}, 10, 10);
  registry.start();
  EXPECT_FALSE(registry.is_ready());
  EXPECT_NE(registry.waiting_for().find("none"), std::string::npos);
  PrefillSpec spec;
  spec.server = *parse_upstream_url("http://127.0.0.1:1");  // nothing listens on port 1
  spec.bootstrap_port = 1;
  const int index = registry.add(spec);
  EXPECT_EQ(index, 0);
  EXPECT_EQ(registry.add(spec), 0);
  EXPECT_EQ(registry.find(spec), std::optional<int>(0));
  EXPECT_FALSE(registry.is_ready());
  ASSERT_EQ(registry.statuses().size(), 1u);
  registry.remove(index);
  EXPECT_TRUE(registry.statuses().empty());
  EXPECT_FALSE(registry.next().has_value());
  EXPECT_EQ(registry.add(spec), 0);  // back, polled again
  EXPECT_EQ(registry.statuses().size(), 1u);
  // Churn: each rejoin after the poller ended joins the old thread and starts one.
  for (int i = 0; i < 20; ++i) {
    registry.remove(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(i % 2 == 0 ? 30 : 0));
    EXPECT_EQ(registry.add(spec), 0);
  }
  EXPECT_EQ(registry.statuses().size(), 1u);
  registry.stop();
}

}  // namespace
}  // namespace crescent::proxy
