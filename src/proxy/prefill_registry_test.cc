#include "proxy/prefill_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "proxy/fake_upstreams.h"

namespace crescent::proxy {
namespace {

using testing::FakeServer;

TEST(BootstrapQueryTest, ReadsEngineIdsByRank) {
  auto ids = parse_bootstrap_query(
      R"({"1":{"engine_id":"b","worker_addr":{"0":{"0":"tcp://x:1"}}},"0":{"engine_id":"a"}})");
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<std::string>{"a", "b"}));
}

TEST(BootstrapQueryTest, RefusesIncompleteAnswers) {
  struct Case {
    const char* body;
    const char* message;
  };
  for (const Case& c :
       {Case{"", "not a JSON object"}, Case{"[]", "not a JSON object"}, Case{"{}", "no dp rank"},
        Case{R"({"x":{"engine_id":"a"}})", "'x'"}, Case{R"({"-1":{"engine_id":"a"}})", "'-1'"},
        Case{R"({"0":{"engine_id":"a"},"2":{"engine_id":"c"}})", "rank 1"},
        Case{R"({"0":{"worker_addr":{}}})", "engine_id"},
        Case{R"({"0":{"engine_id":""}})", "engine_id"}}) {
    auto ids = parse_bootstrap_query(c.body);
    ASSERT_FALSE(ids.is_ok()) << c.body;
    EXPECT_NE(ids.status().message().find(c.message), std::string::npos)
        << c.body << ": " << ids.status().message();
  }
}

PrefillSpec spec_for(const FakeServer& server, const FakeServer& bootstrap) {
  PrefillSpec spec;
  spec.server = *parse_upstream_url(server.url());
  spec.bootstrap_port = bootstrap.port();
  return spec;
}

bool wait_ready(const PrefillRegistry& registry, bool want) {
  auto deadline = Deadline::after_ms(10'000);
  while (registry.is_ready() != want && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return registry.is_ready() == want;
}

TEST(PrefillRegistryTest, ReadyOnlyWhenEveryPrefillAndBootstrapAnswers) {
  auto healthy = std::make_shared<std::atomic<bool>>(false);
  FakeServer p0([healthy](const net::http::Request&, auto writer) {
    writer->send(healthy->load() ? 200 : 503, "application/json", "{}");
  });
  FakeServer b0(testing::bootstrap_handler({"a0", "a1"}));
  FakeServer p1(testing::prefill_handler());
  FakeServer b1(testing::bootstrap_handler({"b0"}));
  PrefillRegistry registry({spec_for(p0, b0), spec_for(p1, b1)}, /*poll_interval_ms=*/10,
                           /*refresh_interval_ms=*/20);
  registry.start();
  ASSERT_TRUE(p0.wait_for_requests("/health", 2, 10'000));
  EXPECT_FALSE(registry.is_ready());
  EXPECT_FALSE(registry.next().has_value());
  EXPECT_NE(registry.waiting_for().find(p0.url() + " (/health answers 503)"), std::string::npos)
      << registry.waiting_for();
  healthy->store(true);
  ASSERT_TRUE(wait_ready(registry, true));
  EXPECT_EQ(registry.waiting_for(), "");
  // Round-robin over (prefill, rank) in order.
  std::vector<std::pair<int, std::string>> picks;
  for (int i = 0; i < 6; ++i) {
    auto pick = registry.next();
    ASSERT_TRUE(pick.has_value());
    picks.emplace_back(pick->prefill_index, pick->source.engine_id);
    EXPECT_EQ(pick->source.bootstrap_addr,
              "http://127.0.0.1:" + std::to_string((pick->prefill_index == 0 ? b0 : b1).port()));
  }
  EXPECT_EQ(picks, (std::vector<std::pair<int, std::string>>{
                       {0, "a0"}, {0, "a1"}, {1, "b0"}, {0, "a0"}, {0, "a1"}, {1, "b0"}}));
  auto statuses = registry.statuses();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_TRUE(statuses[0].is_ready);
  EXPECT_EQ(statuses[0].dp_size, 2);
  EXPECT_EQ(statuses[1].dp_size, 1);
}

TEST(PrefillRegistryTest, FollowsNewEngineIdsAndKeepsReadyThroughAFailedRefresh) {
  FakeServer p0(testing::prefill_handler());
  FakeServer b0(testing::bootstrap_handler({"old"}));
  PrefillRegistry registry({spec_for(p0, b0)}, 10, 10);
  registry.start();
  ASSERT_TRUE(wait_ready(registry, true));
  EXPECT_EQ(registry.next()->source.engine_id, "old");
  b0.set_handler(
      [](const net::http::Request&, auto writer) { writer->send(503, "application/json", "{}"); });
  size_t seen = b0.requests_to("/query").size();
  ASSERT_TRUE(b0.wait_for_requests("/query", seen + 2, 10'000));
  EXPECT_TRUE(registry.is_ready());
  EXPECT_EQ(registry.next()->source.engine_id, "old");
  b0.set_handler(testing::bootstrap_handler({"new0", "new1"}));
  auto deadline = Deadline::after_ms(10'000);
  while (registry.statuses()[0].dp_size != 2 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(registry.statuses()[0].dp_size, 2);
  EXPECT_EQ(registry.next()->source.engine_id, "new0");
  EXPECT_EQ(registry.next()->source.engine_id, "new1");
}

TEST(PrefillRegistryTest, RoutesAroundAPrefillThatIsDown) {
  auto p0_up = std::make_shared<std::atomic<bool>>(true);
  FakeServer p0([p0_up](const net::http::Request&, auto writer) {
    writer->send(p0_up->load() ? 200 : 503, "application/json", "{}");
  });
  FakeServer b0(testing::bootstrap_handler({"a0"}));
  FakeServer p1(testing::prefill_handler());
  FakeServer b1(testing::bootstrap_handler({"b0"}));
  PrefillRegistry registry({spec_for(p0, b0), spec_for(p1, b1)}, 10, 10);
  registry.start();
  ASSERT_TRUE(wait_ready(registry, true));
  auto picks_of = [&](int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      ids.push_back(registry.next()->source.engine_id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  auto wait_up = [&](size_t index, bool want) {
    auto deadline = Deadline::after_ms(10'000);
    while (registry.statuses()[index].is_up != want && !deadline.is_expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return registry.statuses()[index].is_up == want;
  };
  EXPECT_EQ(picks_of(2), (std::vector<std::string>{"a0", "b0"}));
  p0_up->store(false);
  ASSERT_TRUE(wait_up(0, false));
  EXPECT_TRUE(registry.is_ready());
  EXPECT_EQ(picks_of(3), (std::vector<std::string>{"b0", "b0", "b0"}));
  EXPECT_NE(registry.statuses()[0].waiting_for.find("503"), std::string::npos);
  p0_up->store(true);
  ASSERT_TRUE(wait_up(0, true));
  EXPECT_EQ(picks_of(2), (std::vector<std::string>{"a0", "b0"}));
}

TEST(PrefillRegistryTest, StopsPromptlyWhileWaiting) {
  PrefillSpec spec;
  spec.server = *parse_upstream_url("http://127.0.0.1:1");  // nothing listens there
  PrefillRegistry registry({spec}, 10'000, 10'000);
  registry.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(registry.waiting_for().find("http://127.0.0.1:1"), std::string::npos);
  auto started = std::chrono::steady_clock::now();
  registry.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
}

}  // namespace
}  // namespace crescent::proxy
