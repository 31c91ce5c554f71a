// The prefill side frees what it keeps for a decode engine as soon as that engine's control
// connection is gone, instead of at --kv-transfer-timeout (the deadline stays the backstop).
// In-process, the decode engine leaves by shutting its connector down; a kill -9 and a SIGSTOP
// are made with real processes in tests/disagg/pd_fault_test.cc.

#include <gtest/gtest.h>

#include "disagg/connector_test_util.h"

namespace crescent::disagg {
namespace {

using namespace std::chrono_literals;
using engine::KvConnectorEvent;
using testing::FakeBootstrap;
using testing::FakeEngine;
using testing::SideOptions;

class PrefillPeerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SideOptions p;
    p.transfer_timeout = 30s;  // far beyond every wait here: only the peer's loss frees
    prefill_ = FakeEngine::create("prefill-0", nullptr, p);
    ASSERT_NE(prefill_, nullptr);
    bootstrap_.set("prefill-0", prefill_->conn().worker_addr());
  }
  std::unique_ptr<FakeEngine> connected_decode(const std::string& engine_id,
                                               const std::string& transfer_id) {
    auto d = FakeEngine::create(engine_id, &bootstrap_, SideOptions{});
    EXPECT_NE(d, nullptr);
    if (!d) {
      return nullptr;
    }
    // One whole transfer: the decode engine is connected and has said HELLO.
    EXPECT_TRUE(hold("warm-" + transfer_id, transfer_id));
    d->conn().start_remote_prefill("d-" + transfer_id,
                                   testing::decode_params(transfer_id, "prefill-0"),
                                   testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
    auto ev = d->wait_event("d-" + transfer_id, 5s);
    EXPECT_TRUE(ev.has_value() && ev->status.is_ok());
    EXPECT_TRUE(prefill_->wait_event("warm-" + transfer_id, 5s).has_value());
    return d;
  }
  bool hold(const std::string& request_id, const std::string& transfer_id) {
    return prefill_->conn().hold_for_remote_decode(request_id, testing::prefill_params(transfer_id),
                                                   testing::make_prompt(20),
                                                   std::vector<int32_t>{3, 4});
  }

  FakeBootstrap bootstrap_;
  std::unique_ptr<FakeEngine> prefill_;
};

TEST_F(PrefillPeerLossTest, HeldBlocksAreFreedAtOnceWhenTheLastDecodeEngineLeaves) {
  auto decode = connected_decode("decode-0", "T0");
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(hold("p1", "T1"));  // its decode engine will never ask
  ASSERT_TRUE(hold("p2", "T2"));
  auto t0 = std::chrono::steady_clock::now();
  decode->shutdown();
  for (const char* id : {"p1", "p2"}) {
    auto ev = prefill_->wait_event(id, 5s);
    ASSERT_TRUE(ev.has_value()) << id;
    EXPECT_EQ(ev->kind, KvConnectorEvent::Kind::kBlocksReleased);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  auto m = prefill_->conn().metrics();
  EXPECT_EQ(m.prefill.num_peer_lost, 2u);
  EXPECT_EQ(m.prefill.num_in_flight, 0);
  EXPECT_EQ(prefill_->conn().num_pending(), 0);

  // A decode engine that asks for a freed transfer later is told why at once, not at the
  // deadline.
  auto late = FakeEngine::create("decode-1", &bootstrap_, SideOptions{});
  ASSERT_NE(late, nullptr);
  late->conn().start_remote_prefill("d1", testing::decode_params("T1", "prefill-0"),
                                    testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
  auto ev = late->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable) << ev->status.to_string();
  EXPECT_NE(ev->status.message().find("decode engine decode-0 is gone"), std::string::npos)
      << ev->status.message();
  // The prefill side goes on serving the new engine.
  ASSERT_TRUE(hold("p3", "T3"));
  late->conn().start_remote_prefill("d3", testing::decode_params("T3", "prefill-0"),
                                    testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
  ev = late->wait_event("d3", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
}

TEST_F(PrefillPeerLossTest, HeldBlocksStayWhileAnotherDecodeEngineIsConnected) {
  auto d0 = connected_decode("decode-0", "T0");
  auto d1 = connected_decode("decode-1", "T1");
  ASSERT_NE(d0, nullptr);
  ASSERT_NE(d1, nullptr);
  ASSERT_TRUE(hold("p2", "T2"));  // may be decode-1's: it stays held
  d0->shutdown();
  EXPECT_TRUE(prefill_->no_event_within("p2", 300ms));
  EXPECT_EQ(prefill_->conn().num_pending(), 1);
  // ... and decode-1 still gets it.
  d1->conn().start_remote_prefill("d2", testing::decode_params("T2", "prefill-0"),
                                  testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
  auto ev = d1->wait_event("d2", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  EXPECT_TRUE(prefill_->wait_event("p2", 5s).has_value());
  EXPECT_EQ(prefill_->conn().metrics().prefill.num_peer_lost, 0u);
}

}  // namespace
}  // namespace crescent::disagg
