// Property test: long random runs of add / step / abort on small block pools. After every
// operation the engine's invariants hold; at the end no block is in use; and every request
// that finished normally produced exactly what it produces alone.

#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace crescent::engine {
namespace {

using testing::Collected;
using testing::fake_options;
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

}  // namespace
}  // namespace crescent::engine
