// Two connectors in one process (a prefill and a decode "engine", each over its own shared KV
// memory) move real blocks over each transport: the bytes land in exactly the decode engine's
// target blocks, whichever of ASK and hold comes first.

#include "disagg/kv_transfer_connector.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "disagg/connector_test_util.h"

namespace crescent::disagg {
namespace {

using namespace std::chrono_literals;
using engine::KvConnectorEvent;
using testing::FakeBootstrap;
using testing::FakeEngine;
using testing::SideOptions;
using transfer::TransportKind;

class ConnectorTransferTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    options_.transport = GetParam();
    options_.transfer_timeout = 5000ms;
  }

  void start_engines() {
    prefill_ = FakeEngine::create("prefill-0", nullptr, options_);
    ASSERT_NE(prefill_, nullptr);
    decode_ = FakeEngine::create("decode-0", &bootstrap_, options_);
    ASSERT_NE(decode_, nullptr);
    bootstrap_.set("prefill-0", prefill_->conn().worker_addr());
    for (int b = 0; b < prefill_->num_blocks(); ++b) {
      prefill_->fill_pattern(b, 1);
    }
  }

  // Every decode block either holds the prefill block mapped to it, or is untouched.
  void expect_blocks(const std::vector<int32_t>& p_blocks, const std::vector<int32_t>& d_blocks,
                     size_t first) {
    std::map<int32_t, int32_t> source;
    for (size_t i = first; i < d_blocks.size(); ++i) {
      source[d_blocks[i]] = p_blocks[i];
    }
    for (int b = 0; b < decode_->num_blocks(); ++b) {
      auto it = source.find(b);
      if (it == source.end()) {
        EXPECT_TRUE(decode_->block_is(b, testing::kUntouched)) << "decode block " << b;
      } else {
        EXPECT_EQ(
            0, std::memcmp(decode_->block(b), prefill_->block(it->second), decode_->block_bytes()))
            << "decode block " << b << " should hold prefill block " << it->second;
      }
    }
  }

  bool prefill_has_placeholders(int64_t n) {
    return testing::eventually(
        [&] { return prefill_->conn().metrics().prefill.num_in_flight == n; });
  }

  SideOptions options_;
  FakeBootstrap bootstrap_;
  std::unique_ptr<FakeEngine> prefill_;
  std::unique_ptr<FakeEngine> decode_;
};

TEST_P(ConnectorTransferTest, AskBeforeHold) {
  start_engines();
  auto prompt = testing::make_prompt(50);  // 49 tokens sent: 4 blocks
  std::vector<int32_t> p_blocks = {3, 4, 5, 6};
  std::vector<int32_t> d_blocks = {10, 11, 12, 13};
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T1", "prefill-0"), prompt,
                                       d_blocks, 0);
  ASSERT_TRUE(prefill_has_placeholders(1));
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T1"), prompt,
                                                      p_blocks));
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, KvConnectorEvent::Kind::kRemoteKvReady);
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  auto released = prefill_->wait_event("p1", 10s);
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->kind, KvConnectorEvent::Kind::kBlocksReleased);
  expect_blocks(p_blocks, d_blocks, 0);
  EXPECT_EQ(decode_->conn().num_pending(), 0);
  EXPECT_EQ(prefill_->conn().num_pending(), 0);
}

TEST_P(ConnectorTransferTest, HoldBeforeAsk) {
  start_engines();
  auto prompt = testing::make_prompt(33);  // 32 tokens sent: exactly 2 blocks
  std::vector<int32_t> p_blocks = {0, 1, 2};
  std::vector<int32_t> d_blocks = {7, 8, 9};
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T2"), prompt,
                                                      p_blocks));
  EXPECT_EQ(prefill_->conn().num_pending(), 1);
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T2", "prefill-0"), prompt,
                                       d_blocks, 0);
  EXPECT_EQ(decode_->conn().num_pending(), 1);
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  ASSERT_TRUE(prefill_->wait_event("p1", 10s).has_value());
  // Block 2 of the prompt (token 32, the last one) is recomputed by the decode engine.
  expect_blocks({0, 1}, {7, 8}, 0);
}

TEST_P(ConnectorTransferTest, PartialLocalPrefixSendsOnlyTheRest) {
  start_engines();
  auto prompt = testing::make_prompt(70);  // 69 tokens: 5 blocks; 2 held locally
  std::vector<int32_t> p_blocks = {7, 8, 9, 10, 11};
  std::vector<int32_t> d_blocks = {20, 21, 22, 23, 24};
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T3", "prefill-0"), prompt,
                                       d_blocks, 2 * testing::kBlockSize);
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T3"), prompt,
                                                      p_blocks));
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  expect_blocks(p_blocks, d_blocks, 2);
  EXPECT_EQ(decode_->conn().metrics().decode.num_bytes, 3 * decode_->block_bytes());
}

TEST_P(ConnectorTransferTest, ScatteredBlockIdsMapOneToOne) {
  start_engines();
  auto prompt = testing::make_prompt(16 * 6 + 1);  // 6 blocks
  std::vector<int32_t> p_blocks = {5, 6, 7, 20, 2, 3};
  std::vector<int32_t> d_blocks = {9, 3, 4, 5, 30, 31};
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T4"), prompt,
                                                      p_blocks));
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T4", "prefill-0"), prompt,
                                       d_blocks, 0);
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  expect_blocks(p_blocks, d_blocks, 0);
}

TEST_P(ConnectorTransferTest, ManyConcurrentTransfersShareOneConnection) {
  start_engines();
  constexpr int kNum = 8;  // 2 blocks each: prefill blocks 2i, 2i+1 -> decode 31-2i, 30-2i
  std::vector<std::vector<int32_t>> prompts, p_blocks, d_blocks;
  for (int i = 0; i < kNum; ++i) {
    prompts.push_back(testing::make_prompt(20 + i, i));
    p_blocks.push_back({2 * i, 2 * i + 1});
    d_blocks.push_back({31 - 2 * i, 30 - 2 * i});
  }
  for (int i = 0; i < kNum; ++i) {
    std::string t = "T-many-" + std::to_string(i);
    // Half ask first, half hold first.
    if (i % 2 == 0) {
      decode_->conn().start_remote_prefill("d" + std::to_string(i),
                                           testing::decode_params(t, "prefill-0"), prompts[i],
                                           d_blocks[i], 0);
    }
    ASSERT_TRUE(prefill_->conn().hold_for_remote_decode(
        "p" + std::to_string(i), testing::prefill_params(t), prompts[i], p_blocks[i]));
    if (i % 2 == 1) {
      decode_->conn().start_remote_prefill("d" + std::to_string(i),
                                           testing::decode_params(t, "prefill-0"), prompts[i],
                                           d_blocks[i], 0);
    }
  }
  std::vector<int32_t> all_p, all_d;
  for (int i = 0; i < kNum; ++i) {
    auto ev = decode_->wait_event("d" + std::to_string(i), 10s);
    ASSERT_TRUE(ev.has_value()) << i;
    EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
    ASSERT_TRUE(prefill_->wait_event("p" + std::to_string(i), 10s).has_value()) << i;
    all_p.insert(all_p.end(), p_blocks[i].begin(), p_blocks[i].end());
    all_d.insert(all_d.end(), d_blocks[i].begin(), d_blocks[i].end());
  }
  expect_blocks(all_p, all_d, 0);
  EXPECT_EQ(bootstrap_.num_calls(), 1) << "the worker address is cached";
  auto m = decode_->conn().metrics();
  EXPECT_EQ(m.decode.num_ok, uint64_t{kNum});
  EXPECT_EQ(m.recent_fetches.size(), size_t{kNum});
}

TEST_P(ConnectorTransferTest, CancelRacingTheWriteNeverWritesAfterTheEvent) {
  // Large blocks, so that the CANCEL may arrive before, during or after the write.
  options_.block_bytes = 256 << 10;
  options_.num_blocks = 64;
  // Long enough for the ack to come after a slow (sanitizer) write; when it does not, the
  // decode side closes the connection instead and the prefill side aborts the write.
  options_.cancel_grace = 5000ms;
  start_engines();
  auto prompt = testing::make_prompt(16 * 60 + 1);  // 60 blocks, 15 MiB
  std::vector<int32_t> p_blocks, d_blocks;
  for (int i = 0; i < 60; ++i) {
    p_blocks.push_back(i);
    d_blocks.push_back(63 - i);
  }
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T5", "prefill-0"), prompt,
                                       d_blocks, 0);
  ASSERT_TRUE(prefill_has_placeholders(1));
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T5"), prompt,
                                                      p_blocks));
  decode_->conn().cancel("d1");
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kCancelled) << ev->status.to_string();
  auto at_event = decode_->copy_memory();
  ASSERT_TRUE(prefill_->wait_event("p1", 10s).has_value());
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(at_event == decode_->copy_memory()) << "bytes changed after the cancel event";
  auto m = prefill_->conn().metrics();
  // CANCEL during the write (acked after it) or after it (DONE crossed the CANCEL).
  EXPECT_EQ(m.prefill.num_cancelled + m.prefill.num_ok, 1u);
  if (m.prefill.num_write_latency_samples == 1) {
    expect_blocks(p_blocks, d_blocks, 0);  // the write finished before the ack
  } else {
    // No write, or one aborted part-way: nothing outside the target blocks.
    std::vector<bool> is_target(static_cast<size_t>(decode_->num_blocks()), false);
    for (int32_t b : d_blocks) {
      is_target[static_cast<size_t>(b)] = true;
    }
    for (int b = 0; b < decode_->num_blocks(); ++b) {
      if (!is_target[static_cast<size_t>(b)]) {
        EXPECT_TRUE(decode_->block_is(b, testing::kUntouched)) << b;
      }
    }
  }
}

TEST_P(ConnectorTransferTest, CancelDuringTheWriteIsAckedOnlyAfterIt) {
  std::atomic<bool> is_writing{false};
  std::atomic<bool> is_cancel_sent{false};
  options_.on_write_submitted = [&](const std::string&) {
    is_writing = true;
    testing::eventually([&] { return is_cancel_sent.load(); });
    std::this_thread::sleep_for(100ms);  // the CANCEL arrives while the batch is in flight
  };
  start_engines();
  auto prompt = testing::make_prompt(16 * 4 + 1);
  std::vector<int32_t> p_blocks = {1, 2, 3, 4}, d_blocks = {5, 6, 7, 8};
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T9", "prefill-0"), prompt,
                                       d_blocks, 0);
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T9"), prompt,
                                                      p_blocks));
  ASSERT_TRUE(testing::eventually([&] { return is_writing.load(); }));
  auto t0 = std::chrono::steady_clock::now();
  decode_->conn().cancel("d1");
  is_cancel_sent = true;
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kCancelled) << ev->status.to_string();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms) << "acked before the write ended";
  // The ack came after the write: every byte is already there, and stays.
  expect_blocks(p_blocks, d_blocks, 0);
  ASSERT_TRUE(prefill_->wait_event("p1", 10s).has_value());
  auto m = prefill_->conn().metrics();
  EXPECT_EQ(m.prefill.num_cancelled, 1u);
  EXPECT_EQ(m.prefill.num_ok, 0u);
}

TEST_P(ConnectorTransferTest, PrefillShutdownFailsTheFetchPromptly) {
  start_engines();
  auto prompt = testing::make_prompt(40);
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T6", "prefill-0"), prompt,
                                       std::vector<int32_t>{1, 2, 3}, 0);
  ASSERT_TRUE(prefill_has_placeholders(1));
  auto t0 = std::chrono::steady_clock::now();
  prefill_->shutdown();
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);  // transfer_timeout is 5 s
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(ev->status.message().find("closed the connection"), std::string::npos)
      << ev->status.message();
  expect_blocks({}, {}, 0);
}

TEST_P(ConnectorTransferTest, NextRequestReconnectsToARestartedPrefillEngine) {
  start_engines();
  auto prompt = testing::make_prompt(20);
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T7"), prompt,
                                                      std::vector<int32_t>{4, 5}));
  decode_->conn().start_remote_prefill("d1", testing::decode_params("T7", "prefill-0"), prompt,
                                       std::vector<int32_t>{6, 7}, 0);
  auto ev = decode_->wait_event("d1", 10s);
  ASSERT_TRUE(ev.has_value() && ev->status.is_ok());
  // The prefill engine restarts on another port under the same id. (A request sent before
  // the decode side sees the old connection close would fail; wait until it has.)
  prefill_.reset();
  std::this_thread::sleep_for(200ms);
  prefill_ = FakeEngine::create("prefill-0", nullptr, options_);
  ASSERT_NE(prefill_, nullptr);
  prefill_->fill_pattern(9, 2);
  bootstrap_.set("prefill-0", prefill_->conn().worker_addr());
  ASSERT_TRUE(prefill_->conn().hold_for_remote_decode("p2", testing::prefill_params("T8"), prompt,
                                                      std::vector<int32_t>{9, 10}));
  decode_->conn().start_remote_prefill("d2", testing::decode_params("T8", "prefill-0"), prompt,
                                       std::vector<int32_t>{12, 13}, 0);
  ev = decode_->wait_event("d2", 10s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  EXPECT_EQ(0, std::memcmp(decode_->block(12), prefill_->block(9), decode_->block_bytes()));
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectorTransferTest,
                         ::testing::ValuesIn(transfer::available_transports()),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return std::string(transfer::transport_name(info.param));
                         });

}  // namespace
}  // namespace crescent::disagg
