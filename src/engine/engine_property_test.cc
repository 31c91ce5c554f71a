// Property test: long random runs of add / step / abort on small block pools. After every
// operation the engine's invariants hold; at the end no block is in use; and every request
// that finished normally produced exactly what it produces alone. The remote variant mixes in
// P/D requests and a fake connector that completes, fails and releases at random steps.

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/fake_kv_connector_test_util.h"

namespace crescent::engine {
namespace {

using testing::Collected;
using testing::fake_options;
using testing::FakeKvConnector;
using testing::FakeModelRunner;
using testing::kVocab;

struct Config {
  int num_blocks;
  int block_size;
  int max_num_batched_tokens;
  int max_num_seqs;
  bool prefix_caching;
};

void run_random_ops(uint32_t seed, const Config& config, int num_ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  FakeModelRunner runner(kVocab, config.num_blocks, config.block_size);
  EngineOptions o = fake_options(config.block_size);
  o.max_num_batched_tokens = config.max_num_batched_tokens;
  o.max_num_seqs = config.max_num_seqs;
  o.enable_prefix_caching = config.prefix_caching;
  o.max_model_len = config.num_blocks * config.block_size;
  Engine engine(o, &runner);

  // A few shared prefixes so that the prefix cache is exercised.
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 3 * config.block_size; ++j) {
      p.push_back(static_cast<int32_t>(rng() % (kVocab - 1)));
    }
    prefixes.push_back(p);
  }
  std::map<std::string, EngineRequest> submitted;
  std::map<std::string, Collected> got;
  std::vector<std::string> live;
  int next_id = 0;

  auto check = [&] {
    Status s = engine.check_invariants();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  };
  for (int op = 0; op < num_ops; ++op) {
    const uint32_t kind = rng() % 10;
    if (kind < 3) {
      EngineRequest r;
      r.request_id = "r" + std::to_string(next_id++);
      if (rng() % 2 == 0) {
        const auto& p = prefixes[rng() % prefixes.size()];
        r.prompt_token_ids.assign(p.begin(), p.begin() + 1 + rng() % p.size());
      }
      const int extra = static_cast<int>(rng() % (2 * config.block_size + 2));
      for (int j = 0; j < extra || r.prompt_token_ids.empty(); ++j) {
        r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % (kVocab - 1)));
      }
      r.sampling.max_tokens = 1 + static_cast<int>(rng() % 12);
      if (rng() % 2 == 0) {
        r.sampling.temperature = 0;
      } else {
        r.sampling.seed = rng();
        r.sampling.top_k = static_cast<int32_t>(rng() % 8);
      }
      if (rng() % 4 == 0) {
        r.sampling.stop = {"a", "bc"};
      }
      ASSERT_TRUE(engine.add_request(r).is_ok());
      submitted[r.request_id] = r;
      live.push_back(r.request_id);
    } else if (kind < 4 && !live.empty()) {
      engine.abort(live[rng() % live.size()]);
    } else {
      Result<std::vector<RequestOutput>> out = engine.step();
      ASSERT_TRUE(out.is_ok());
      testing::collect(*out, got);
      for (const RequestOutput& o : *out) {
        if (o.finished) {
          std::erase(live, o.request_id);
        }
      }
    }
    check();
  }
  // Drain.
  while (engine.has_unfinished_requests()) {
    Result<std::vector<RequestOutput>> out = engine.step();
    ASSERT_TRUE(out.is_ok());
    testing::collect(*out, got);
    check();
  }
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
  EXPECT_EQ(engine.stats().num_running + engine.stats().num_waiting, 0);

  int num_compared = 0;
  for (const auto& [id, request] : submitted) {
    const Collected& c = got[id];
    ASSERT_TRUE(c.finished) << id << " never finished";
    EXPECT_NE(c.reason, FinishReason::kError) << id << ": " << c.error;
    if (c.reason == FinishReason::kAbort || num_compared >= 40) {
      continue;
    }
    ++num_compared;
    Collected alone =
        testing::run_alone(request, config.block_size, config.num_blocks * config.block_size);
    EXPECT_EQ(c.tokens, alone.tokens) << id;
    EXPECT_EQ(c.text, alone.text) << id;
  }
}

TEST(EnginePropertyTest, RandomOperationsKeepInvariantsAndFreeEverything) {
  const Config configs[] = {
      {8, 4, 16, 4, true},    // tight: constant preemption
      {12, 2, 5, 8, true},    // tiny chunks
      {16, 4, 64, 3, false},  // no prefix cache
      {32, 8, 32, 16, true},
  };
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    run_random_ops(seed, configs[seed % 4], 1000);
    if (HasFatalFailure()) {
      return;
    }
  }
}

// Decode-side (remote prefill) and prefill-side (remote decode) requests beside local ones in
// one engine; the test plays the peer. A fetch is completed by writing the prompt's K/V into
// the blocks it was given, even when the engine cancelled it (a peer racing the cancel): had
// the engine reused those blocks, another request's K/V would be overwritten and its output
// would differ from its solo run. A hold is checked to still hold its prompt's K/V when the
// peer "reads" it at release.
void run_random_remote_ops(uint32_t seed, const Config& config, int num_ops) {
  SCOPED_TRACE("remote seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  FakeModelRunner runner(kVocab, config.num_blocks, config.block_size);
  FakeKvConnector connector;
  EngineOptions o = fake_options(config.block_size);
  o.max_num_batched_tokens = config.max_num_batched_tokens;
  o.max_num_seqs = config.max_num_seqs;
  o.enable_prefix_caching = config.prefix_caching;
  o.max_model_len = config.num_blocks * config.block_size;
  o.kv_connector = &connector;
  Engine engine(o, &runner);

  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 3 * config.block_size + 1; ++j) {
      p.push_back(static_cast<int32_t>(rng() % (kVocab - 1)));
    }
    prefixes.push_back(p);
  }
  std::map<std::string, EngineRequest> submitted;
  std::set<std::string> failed_on_purpose;
  std::map<std::string, Collected> got;
  std::vector<std::string> live;
  int next_id = 0;
  int num_fetches_done = 0;
  int num_holds_released = 0;

  auto check = [&] {
    Status s = engine.check_invariants();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  };
  auto do_step = [&] {
    connector.set_hold_result(rng() % 4 != 0);
    Result<std::vector<RequestOutput>> out = engine.step();
    ASSERT_TRUE(out.is_ok());
    testing::collect(*out, got);
    for (const RequestOutput& r : *out) {
      if (r.finished) {
        std::erase(live, r.request_id);
      }
    }
  };
  // The peer ends one pending fetch: writes what it was asked for, then reports.
  auto complete_a_fetch = [&] {
    auto pending = connector.pending_fetches();
    if (pending.empty()) {
      return false;
    }
    auto it = std::next(pending.begin(), static_cast<long>(rng() % pending.size()));
    const FakeKvConnector::Fetch& f = it->second;
    const int64_t end = static_cast<int64_t>(f.prompt_token_ids.size()) - 1;
    const bool fail = rng() % 5 == 0;
    if (!fail || rng() % 2 == 0) {
      runner.write_kv(f.prompt_token_ids, f.block_ids, f.num_local_tokens, end);
    }
    if (fail && !f.cancelled) {
      failed_on_purpose.insert(f.request_id);
    }
    EXPECT_TRUE(
        connector.complete_fetch(f.request_id, fail ? unavailable("peer failed") : Status::ok()));
    ++num_fetches_done;
    return true;
  };
  auto release_a_hold = [&] {
    auto pending = connector.pending_holds();
    if (pending.empty()) {
      return false;
    }
    auto it = std::next(pending.begin(), static_cast<long>(rng() % pending.size()));
    const FakeKvConnector::Hold& h = it->second;
    EXPECT_TRUE(runner.holds_kv(h.prompt_token_ids, h.block_ids, 0,
                                static_cast<int64_t>(h.prompt_token_ids.size())))
        << h.request_id << ": held blocks were reused before the peer released them";
    EXPECT_TRUE(connector.release_hold(h.request_id));
    ++num_holds_released;
    return true;
  };

  for (int op = 0; op < num_ops; ++op) {
    const uint32_t kind = rng() % 12;
    if (kind < 3) {
      EngineRequest r;
      r.request_id = "r" + std::to_string(next_id++);
      if (rng() % 2 == 0) {
        const auto& p = prefixes[rng() % prefixes.size()];
        r.prompt_token_ids.assign(p.begin(), p.begin() + 1 + rng() % p.size());
      }
      const int extra = static_cast<int>(rng() % (2 * config.block_size + 2));
      for (int j = 0; j < extra || r.prompt_token_ids.empty(); ++j) {
        r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % (kVocab - 1)));
      }
      r.sampling.max_tokens = 1 + static_cast<int>(rng() % 12);
      if (rng() % 2 == 0) {
        r.sampling.temperature = 0;
      } else {
        r.sampling.seed = rng();
        r.sampling.top_k = static_cast<int32_t>(rng() % 8);
      }
      const uint32_t role = rng() % 3;
      if (role == 0) {
        r.kv_transfer_params.do_remote_prefill = true;
      } else if (role == 1) {
        r.kv_transfer_params.do_remote_decode = true;
        if (rng() % 2 == 0) {
          r.sampling.max_tokens = 1;  // what the proxy sends
        }
      }
      r.kv_transfer_params.transfer_id = "xfer-" + r.request_id;
      ASSERT_TRUE(engine.add_request(r).is_ok());
      submitted[r.request_id] = r;
      live.push_back(r.request_id);
    } else if (kind < 4 && !live.empty()) {
      engine.abort(live[rng() % live.size()]);
    } else if (kind < 5) {
      complete_a_fetch();
    } else if (kind < 6) {
      release_a_hold();
    } else {
      do_step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    check();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
  // Drain: step, and play the peer whenever the engine waits on it.
  for (int i = 0; i < 100000 && engine.has_unfinished_requests(); ++i) {
    const int64_t steps = engine.stats().num_steps_total;
    do_step();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    check();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    if (engine.stats().num_steps_total == steps) {
      if (!complete_a_fetch()) {
        release_a_hold();
      }
    }
  }
  ASSERT_FALSE(engine.has_unfinished_requests());
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
  EXPECT_EQ(engine.stats().num_blocks_held_for_remote, 0);
  EXPECT_EQ(engine.stats().num_running + engine.stats().num_waiting +
                engine.stats().num_waiting_for_remote_kv,
            0);
  EXPECT_EQ(connector.num_pending(), 0);
  EXPECT_GT(num_fetches_done, 0);
  EXPECT_GT(num_holds_released, 0);

  int num_compared = 0;
  for (const auto& [id, request] : submitted) {
    const Collected& c = got[id];
    ASSERT_TRUE(c.finished) << id << " never finished";
    if (failed_on_purpose.contains(id)) {
      // An abort between the failure report and the next step wins: the report then only
      // frees the aborted fetch's blocks.
      if (c.reason != FinishReason::kAbort) {
        EXPECT_EQ(c.reason, FinishReason::kError) << id;
        EXPECT_EQ(c.error, "peer failed") << id;
      }
      continue;
    }
    EXPECT_NE(c.reason, FinishReason::kError) << id << ": " << c.error;
    if (c.reason == FinishReason::kAbort || num_compared >= 60) {
      continue;
    }
    ++num_compared;
    EngineRequest plain = request;
    plain.kv_transfer_params = {};
    Collected alone =
        testing::run_alone(plain, config.block_size, config.num_blocks * config.block_size);
    EXPECT_EQ(c.tokens, alone.tokens) << id;
    EXPECT_EQ(c.text, alone.text) << id;
  }
}

TEST(EnginePropertyTest, RandomRemoteRequestsKeepInvariantsAndFreeEverything) {
  const Config configs[] = {
      {12, 4, 16, 4, true},   // tight: preemption beside parked and held requests
      {16, 2, 5, 8, true},    // tiny chunks
      {24, 4, 64, 3, false},  // no prefix cache
      {40, 8, 32, 16, true},
  };
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    run_random_remote_ops(seed, configs[seed % 4], 1000);
    if (HasFatalFailure()) {
      return;
    }
  }
}

}  // namespace
}  // namespace crescent::engine
