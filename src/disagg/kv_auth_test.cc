// The KV connector with --auth-token-file: matching tokens transfer as before; a decode engine
// with another token, or without one, fails its request with a clear error within the deadline
// and the prefill side frees its blocks.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "disagg/connector_test_util.h"
#include "net/auth/handshake.h"

namespace crescent::disagg {
namespace {

using namespace std::chrono_literals;
using engine::KvConnectorEvent;
using testing::FakeBootstrap;
using testing::FakeEngine;
using testing::SideOptions;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class KvAuthTest : public ::testing::TestWithParam<transfer::TransportKind> {
 protected:
  void start(const std::string& p_token, const std::string& d_token) {
    SideOptions p, d;
    p.transport = d.transport = GetParam();
    p.transfer_timeout = d.transfer_timeout = 2000ms;
    p.auth_token = p_token;
    d.auth_token = d_token;
    prefill_ = FakeEngine::create("prefill-0", nullptr, p);
    ASSERT_NE(prefill_, nullptr);
    decode_ = FakeEngine::create("decode-0", &bootstrap_, d);
    ASSERT_NE(decode_, nullptr);
    bootstrap_.set("prefill-0", prefill_->conn().worker_addr());
    for (int b = 0; b < prefill_->num_blocks(); ++b)
      prefill_->fill_pattern(b, 5);
  }

  // Holds on P, asks from D; returns D's event.
  KvConnectorEvent run_transfer() {
    auto prompt = testing::make_prompt(50);
    const std::vector<int32_t> p_blocks = {3, 4, 5, 6};
    const std::vector<int32_t> d_blocks = {10, 11, 12, 13};
    EXPECT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T1"), prompt,
                                                        p_blocks));
    decode_->conn().start_remote_prefill("d1", testing::decode_params("T1", "prefill-0"), prompt,
                                         d_blocks, 0);
    auto ev = decode_->wait_event("d1", 10s);
    EXPECT_TRUE(ev.has_value());
    return ev.value_or(KvConnectorEvent{});
  }

  bool prefill_released() {
    auto released = prefill_->wait_event("p1", 5s);
    return released.has_value() && released->kind == KvConnectorEvent::Kind::kBlocksReleased &&
           prefill_->conn().num_pending() == 0;
  }

  FakeBootstrap bootstrap_;
  std::unique_ptr<FakeEngine> prefill_;
  std::unique_ptr<FakeEngine> decode_;
};

TEST_P(KvAuthTest, SameTokenTransfers) {
  start("shared-token-0123456789", "shared-token-0123456789");
  KvConnectorEvent ev = run_transfer();
  EXPECT_EQ(ev.kind, KvConnectorEvent::Kind::kRemoteKvReady);
  ASSERT_TRUE(ev.status.is_ok()) << ev.status.to_string();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(prefill_->block(3 + i), decode_->block(10 + i), prefill_->block_bytes()),
              0);
  }
  EXPECT_TRUE(prefill_released());
}

TEST_P(KvAuthTest, WrongTokenFailsClearlyAndFreesThePrefillBlocks) {
  const uint64_t refused_before = net::auth::num_refused_connections();
  start("prefill-token-0123456789", "another-token-0123456789");
  const auto t0 = std::chrono::steady_clock::now();
  KvConnectorEvent ev = run_transfer();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(ev.status.code(), StatusCode::kPermissionDenied) << ev.status.to_string();
  EXPECT_TRUE(contains(ev.status.message(), "another token")) << ev.status.message();
  EXPECT_TRUE(prefill_released());
  EXPECT_GT(net::auth::num_refused_connections(), refused_before);
}

TEST_P(KvAuthTest, DecodeWithoutTokenIsToldThePeerRequiresAuthentication) {
  start("prefill-token-0123456789", "");
  KvConnectorEvent ev = run_transfer();
  EXPECT_EQ(ev.status.code(), StatusCode::kPermissionDenied) << ev.status.to_string();
  EXPECT_TRUE(contains(ev.status.message(), "requires authentication")) << ev.status.message();
  EXPECT_TRUE(prefill_released());
}

TEST_P(KvAuthTest, DecodeWithTokenAgainstAnOpenPrefillFailsAtOnce) {
  start("", "decode-token-0123456789");
  const auto t0 = std::chrono::steady_clock::now();
  KvConnectorEvent ev = run_transfer();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(ev.status.code(), StatusCode::kFailedPrecondition) << ev.status.to_string();
  EXPECT_TRUE(contains(ev.status.message(), "did not authenticate")) << ev.status.message();
  EXPECT_TRUE(prefill_released());
}

INSTANTIATE_TEST_SUITE_P(Transports, KvAuthTest,
                         ::testing::Values(transfer::TransportKind::kShm,
                                           transfer::TransportKind::kTcp));

}  // namespace
}  // namespace crescent::disagg
