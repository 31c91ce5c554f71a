#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/engine_test_util.h"

namespace crescent::engine {
namespace {

using testing::Collected;
using testing::fake_options;
using testing::FakeModelRunner;
using testing::kEos;
using testing::kVocab;
using testing::run_all;
using testing::run_alone;
using testing::tok;
using testing::toks;

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, kVocab - 2);
  std::vector<int32_t> v(n);
  for (int32_t& t : v) {
    t = d(rng);
  }
  return v;
}

// A mix of greedy and seeded random requests.
std::vector<EngineRequest> mixed_requests(int n, uint32_t seed, int max_prompt = 40) {
  std::mt19937 rng(seed);
  std::vector<EngineRequest> out;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.request_id = "req-" + std::to_string(i);
    r.prompt_token_ids = random_tokens(rng, 1 + static_cast<int>(rng() % max_prompt));
    r.sampling.max_tokens = 5 + static_cast<int>(rng() % 25);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = 12;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1000 + i;
    } else {
      r.sampling.temperature = 0;
    }
    out.push_back(r);
  }
  return out;
}

void expect_same(const Collected& got, const Collected& want, const std::string& id) {
  EXPECT_EQ(got.tokens, want.tokens) << id;
  EXPECT_EQ(got.text, want.text) << id;
  EXPECT_EQ(got.reason, want.reason) << id;
  EXPECT_TRUE(got.finished) << id;
}

TEST(EngineTest, BatchedEqualsOneAtATime) {
  FakeModelRunner runner(kVocab, 256, 4);
  Engine engine(fake_options(), &runner);
  std::vector<EngineRequest> requests = mixed_requests(12, 1);
  for (const EngineRequest& r : requests) {
    ASSERT_TRUE(engine.add_request(r).is_ok());
  }
  auto got = run_all(engine);
  EXPECT_GT(runner.max_batch_seqs(), 1);
  for (const EngineRequest& r : requests) {
    expect_same(got[r.request_id], run_alone(r), r.request_id);
  }
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

TEST(EngineTest, ChunkedPrefillEqualsWholePrefill) {
  FakeModelRunner runner(kVocab, 256, 4);
  EngineOptions o = fake_options();
  o.max_num_batched_tokens = 7;
  Engine engine(o, &runner);
  std::vector<EngineRequest> requests = mixed_requests(4, 2, 60);
  for (const EngineRequest& r : requests) {
    ASSERT_TRUE(engine.add_request(r).is_ok());
  }
  auto got = run_all(engine);
  EXPECT_LE(runner.max_batch_tokens(), 7);
  for (const EngineRequest& r : requests) {
    expect_same(got[r.request_id], run_alone(r), r.request_id);
  }
}

TEST(EngineTest, PrefixCacheHitEqualsMissAndIsCounted) {
  FakeModelRunner runner(kVocab, 256, 4);
  Engine engine(fake_options(), &runner);
  std::mt19937 rng(3);
  EngineRequest a;
  a.request_id = "a";
  a.prompt_token_ids = random_tokens(rng, 37);
  a.sampling.temperature = 0;
  a.sampling.max_tokens = 6;
  ASSERT_TRUE(engine.add_request(a).is_ok());
  run_all(engine);
  const int64_t computed_before = runner.num_tokens_computed();

  EngineRequest b = a;
  b.request_id = "b";
  b.prompt_token_ids.push_back(5);
  b.prompt_token_ids.push_back(9);
  b.sampling.seed = 77;
  b.sampling.temperature = 1.0f;
  ASSERT_TRUE(engine.add_request(b).is_ok());
  auto got = run_all(engine);
  EXPECT_EQ(got["b"].num_cached_tokens, 36);  // 9 full blocks of a's prompt
  // Only b's 3 uncached prompt tokens and its decode steps were computed.
  EXPECT_EQ(runner.num_tokens_computed() - computed_before, 3 + (b.sampling.max_tokens - 1));
  expect_same(got["b"], run_alone(b), "b");
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.prefix_cache_queries_tokens, 37 + 39);
  EXPECT_EQ(s.prefix_cache_hits_tokens, 36);

  // The whole prompt cached: the last token is still computed.
  EngineRequest c = a;
  c.request_id = "c";
  c.prompt_token_ids.resize(36);
  ASSERT_TRUE(engine.add_request(c).is_ok());
  got = run_all(engine);
  EXPECT_EQ(got["c"].num_cached_tokens, 32);
  expect_same(got["c"], run_alone(c), "c");
}

// The choices of an n = 4 request arrive together: the prompt is computed once, the other
// three take its full blocks from the prefix cache, and each choice equals itself run alone.
TEST(EngineTest, ChoicesOfOnePromptComputeItOnce) {
  FakeModelRunner runner(kVocab, 256, 4);
  Engine engine(fake_options(), &runner);
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = random_tokens(rng, 37);
  std::vector<EngineRequest> choices;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.request_id = "cmpl/" + std::to_string(i);
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 100 + i;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    choices.push_back(r);
    ASSERT_TRUE(engine.add_request(r).is_ok());
  }
  auto got = run_all(engine);
  // 37 prompt tokens once, 1 for each other choice (its last prompt token), 5 decode steps each.
  EXPECT_EQ(runner.num_tokens_computed(), 37 + 3 * 1 + 4 * 5);
  EXPECT_EQ(engine.stats().prefix_cache_hits_tokens, 3 * 36);
  for (const EngineRequest& r : choices) {
    EXPECT_EQ(got[r.request_id].num_cached_tokens, r.request_id == "cmpl/0" ? 0 : 36);
    expect_same(got[r.request_id], run_alone(r), r.request_id);
  }
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

TEST(EngineTest, PreemptionAndRecomputeEqualsUninterrupted) {
  // 12 blocks of 4 tokens for 6 requests that each grow to 30 tokens: preemption is certain.
  FakeModelRunner runner(kVocab, 12, 4);
  EngineOptions o = fake_options();
  o.max_model_len = 48;
  Engine engine(o, &runner);
  std::vector<EngineRequest> requests = mixed_requests(6, 4, 12);
  for (EngineRequest& r : requests) {
    r.sampling.max_tokens = 20;
    ASSERT_TRUE(engine.add_request(r).is_ok());
  }
  auto got = run_all(engine);
  EXPECT_GT(engine.stats().num_preemptions_total, 0);
  for (const EngineRequest& r : requests) {
    expect_same(got[r.request_id], run_alone(r, 4, 48), r.request_id);
  }
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

TEST(EngineTest, AbortAtEveryStageFreesBlocks) {
  FakeModelRunner runner(kVocab, 64, 4);
  EngineOptions o = fake_options();
  o.max_num_batched_tokens = 10;
  o.max_num_seqs = 2;
  Engine engine(o, &runner);
  auto add = [&](const std::string& id, int len) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_token_ids.assign(len, 3);
    r.prompt_token_ids[0] = static_cast<int32_t>(id[0] - 'a');
    r.sampling.max_tokens = 100;
    r.sampling.temperature = 0;
    ASSERT_TRUE(engine.add_request(r).is_ok());
  };
  add("decoding", 3);
  ASSERT_TRUE(engine.step().is_ok());
  add("prefilling", 40);
  add("waiting", 5);
  ASSERT_TRUE(engine.step().is_ok());  // prefilling's first chunk; waiting has no seat
  EngineStats s = engine.stats();
  EXPECT_EQ(s.num_running, 2);
  EXPECT_EQ(s.num_waiting, 1);
  EXPECT_GT(s.num_blocks_used, 0);

  for (const char* id : {"waiting", "prefilling", "decoding"}) {
    engine.abort(id);
    ASSERT_TRUE(engine.check_invariants().is_ok());
    Result<std::vector<RequestOutput>> out = engine.step();
    ASSERT_TRUE(out.is_ok());
    bool seen = false;
    for (const RequestOutput& o : *out) {
      if (o.request_id == id) {
        seen = true;
        EXPECT_TRUE(o.finished);
        EXPECT_EQ(o.finish_reason, FinishReason::kAbort);
      }
    }
    EXPECT_TRUE(seen) << id;
    ASSERT_TRUE(engine.check_invariants().is_ok());
  }
  engine.abort("unknown");  // ignored
  EXPECT_FALSE(engine.has_unfinished_requests());
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
  EXPECT_EQ(engine.stats().num_running + engine.stats().num_waiting, 0);
}

EngineRequest scripted(FakeModelRunner& runner, const std::string& id, int32_t first,
                       const std::vector<int32_t>& script, int max_tokens = 50) {
  runner.set_script(first, 2, script);
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = {first, 30};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(EngineTest, StopStringAcrossTokensIsCutAndHeldBack) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest r = scripted(runner, "r", 40, toks("hello world"));
  r.sampling.stop = {"lo w", "xyz"};
  ASSERT_TRUE(engine.add_request(r).is_ok());
  Collected c = run_all(engine)["r"];
  EXPECT_EQ(c.text, "hel");
  EXPECT_EQ(c.tokens, toks("hello w"));  // up to the token that completed the stop string
  EXPECT_EQ(c.reason, FinishReason::kStop);
  EXPECT_EQ(c.stop_reason, "lo w");
  // "l", "lo", "lo " are held back as possible starts of "lo w" until resolved.
  EXPECT_EQ(c.text_per_output, (std::vector<std::string>{"h", "e", "", "l", "", "", ""}));
}

TEST(EngineTest, FalseStartOfAStopStringIsReleased) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest r = scripted(runner, "r", 41, toks("hello world"), 11);
  r.sampling.stop = {"lx", "dz"};
  ASSERT_TRUE(engine.add_request(r).is_ok());
  Collected c = run_all(engine)["r"];
  EXPECT_EQ(c.text, "hello world");  // the trailing "d" (a start of "dz") comes at the end
  EXPECT_EQ(c.reason, FinishReason::kLength);
  EXPECT_EQ(c.text_per_output.back(), "ld");  // "l" waited for the next token
}

TEST(EngineTest, HeldDetokenizerBytesAreFlushedAtTheEnd) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  ASSERT_TRUE(engine.add_request(scripted(runner, "r", 42, {0, 37, 1, 37}, 4)).is_ok());
  Collected c = run_all(engine)["r"];
  EXPECT_EQ(c.text,
            "a\xc3\xa9"
            "b\xc3\xa9");
}

TEST(EngineTest, StopTokensEosAndIgnoreEos) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest stop_tok = scripted(runner, "stop_tok", 43, {0, 1, 5, 2}, 10);
  stop_tok.sampling.stop_token_ids = {5};
  EngineRequest eos = scripted(runner, "eos", 44, {0, kEos, 2}, 10);
  EngineRequest ignore = eos;
  ignore.request_id = "ignore";
  ignore.sampling.ignore_eos = true;
  ignore.sampling.max_tokens = 5;
  ASSERT_TRUE(engine.add_request(stop_tok).is_ok());
  ASSERT_TRUE(engine.add_request(eos).is_ok());
  ASSERT_TRUE(engine.add_request(ignore).is_ok());
  auto got = run_all(engine);
  EXPECT_EQ(got["stop_tok"].tokens, (std::vector<int32_t>{0, 1, 5}));
  EXPECT_EQ(got["stop_tok"].text, "ab");  // the stop token's text is not returned
  EXPECT_EQ(got["stop_tok"].reason, FinishReason::kStop);
  EXPECT_EQ(got["stop_tok"].stop_token_id, 5);
  EXPECT_EQ(got["eos"].tokens, (std::vector<int32_t>{0, kEos}));
  EXPECT_EQ(got["eos"].text, "a");
  EXPECT_EQ(got["eos"].stop_token_id, kEos);
  EXPECT_EQ(got["ignore"].tokens.size(), 5u);
  EXPECT_EQ(got["ignore"].tokens[1], kEos);
  EXPECT_EQ(got["ignore"].text.substr(0, 2), "ac");  // eos is special: skipped as text
  EXPECT_EQ(got["ignore"].reason, FinishReason::kLength);
}

TEST(EngineTest, MinTokensHoldsBackEosAndStopTokens) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest eos = scripted(runner, "eos", 20, {0, kEos, 2, kEos}, 10);
  eos.sampling.min_tokens = 3;
  EngineRequest stop_tok = scripted(runner, "stop_tok", 21, {0, 5, 2, 5}, 10);
  stop_tok.sampling.stop_token_ids = {5};
  stop_tok.sampling.min_tokens = 2;
  EngineRequest after = scripted(runner, "after", 22, {0, kEos}, 10);
  after.sampling.min_tokens = 1;  // the second token may end it
  EngineRequest length = scripted(runner, "length", 23, {kEos, kEos}, 2);
  length.sampling.min_tokens = 2;  // = max_tokens: only length ends it
  for (const EngineRequest& r : {eos, stop_tok, after, length}) {
    ASSERT_TRUE(engine.add_request(r).is_ok()) << r.request_id;
  }
  auto got = run_all(engine);
  // The EOS the model wants second is masked; the first EOS after min_tokens ends it.
  ASSERT_EQ(got["eos"].tokens.size(), 4u);
  EXPECT_NE(got["eos"].tokens[1], kEos);
  EXPECT_EQ(got["eos"].tokens[3], kEos);
  EXPECT_EQ(got["eos"].reason, FinishReason::kStop);
  EXPECT_EQ(got["eos"].stop_token_id, kEos);
  ASSERT_EQ(got["stop_tok"].tokens.size(), 4u);
  EXPECT_NE(got["stop_tok"].tokens[1], 5);
  EXPECT_NE(got["stop_tok"].tokens[1], kEos);  // EOS is masked too
  EXPECT_EQ(got["stop_tok"].stop_token_id, 5);
  EXPECT_EQ(got["after"].tokens, (std::vector<int32_t>{0, kEos}));
  EXPECT_EQ(got["after"].reason, FinishReason::kStop);
  ASSERT_EQ(got["length"].tokens.size(), 2u);
  EXPECT_EQ(std::count(got["length"].tokens.begin(), got["length"].tokens.end(), kEos), 0);
  EXPECT_EQ(got["length"].reason, FinishReason::kLength);
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

// vLLM's rule: a stop string is honoured only when it ends in a token after the first
// min_tokens; one that starts before and ends after counts.
TEST(EngineTest, MinTokensDefersStopStrings) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest again = scripted(runner, "again", 20, toks("abab"), 4);
  again.sampling.stop = {"ab"};
  again.sampling.min_tokens = 2;
  EngineRequest across = scripted(runner, "across", 21, toks("xab"), 3);
  across.sampling.stop = {"ab"};
  across.sampling.min_tokens = 2;
  // "b" is complete at the second token, while "ab" (a start of "abc") is held back: it must
  // not match later.
  EngineRequest inside = scripted(runner, "inside", 22, toks("abd"), 3);
  inside.sampling.stop = {"b", "abc"};
  inside.sampling.min_tokens = 2;
  EngineRequest control = inside;
  control.request_id = "control";
  control.sampling.min_tokens = 0;
  for (const EngineRequest& r : {again, across, inside, control}) {
    ASSERT_TRUE(engine.add_request(r).is_ok()) << r.request_id;
  }
  auto got = run_all(engine);
  EXPECT_EQ(got["again"].text, "ab");
  EXPECT_EQ(got["again"].tokens, toks("abab"));
  EXPECT_EQ(got["again"].stop_reason, "ab");
  EXPECT_EQ(got["across"].text, "x");
  EXPECT_EQ(got["across"].stop_reason, "ab");
  EXPECT_EQ(got["inside"].text, "abd");
  EXPECT_EQ(got["inside"].reason, FinishReason::kLength);
  EXPECT_EQ(got["control"].text, "a");
  EXPECT_EQ(got["control"].stop_reason, "b");
}

TEST(EngineTest, IncludeStopStrInOutput) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest str = scripted(runner, "str", 20, toks("hello world"));
  str.sampling.stop = {"lo w"};
  str.sampling.include_stop_str_in_output = true;
  // The stop string ends inside the piece "ab": the text stops with it.
  EngineRequest piece = scripted(runner, "piece", 21, {tok('h'), 38, tok('c')});
  piece.sampling.stop = {"ha"};
  piece.sampling.include_stop_str_in_output = true;
  EngineRequest stop_tok = scripted(runner, "stop_tok", 22, {0, 1, 5, 2});
  stop_tok.sampling.stop_token_ids = {5};
  stop_tok.sampling.include_stop_str_in_output = true;
  EngineRequest eos = scripted(runner, "eos", 23, {0, kEos});
  eos.sampling.include_stop_str_in_output = true;
  for (const EngineRequest& r : {str, piece, stop_tok, eos}) {
    ASSERT_TRUE(engine.add_request(r).is_ok()) << r.request_id;
  }
  auto got = run_all(engine);
  EXPECT_EQ(got["str"].text, "hello w");
  EXPECT_EQ(got["str"].stop_reason, "lo w");
  EXPECT_EQ(got["str"].reason, FinishReason::kStop);
  EXPECT_EQ(got["piece"].text, "ha");
  EXPECT_EQ(got["piece"].stop_reason, "ha");
  EXPECT_EQ(got["stop_tok"].text, "abf");  // the stop token's text is returned too
  EXPECT_EQ(got["stop_tok"].stop_token_id, 5);
  EXPECT_EQ(got["eos"].text, "a");  // EOS is special: skipped as text
  EXPECT_EQ(got["eos"].stop_token_id, kEos);
}

TEST(EngineTest, LogitBiasSteersGreedy) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest up;
  up.request_id = "up";
  up.prompt_token_ids = {1, 2, 3};
  up.sampling.temperature = 0;
  up.sampling.max_tokens = 4;
  up.sampling.logit_bias = {{9, 100.0f}};
  EngineRequest down = scripted(runner, "down", 20, {0, 0, 0}, 3);
  down.sampling.logit_bias = {{0, -100.0f}};  // the model's 100 becomes 0, below the rest
  ASSERT_TRUE(engine.add_request(up).is_ok());
  ASSERT_TRUE(engine.add_request(down).is_ok());
  auto got = run_all(engine);
  EXPECT_EQ(got["up"].tokens, (std::vector<int32_t>{9, 9, 9, 9}));
  EXPECT_EQ(got["up"].text, "jjjj");
  ASSERT_FALSE(got["down"].tokens.empty());
  EXPECT_EQ(std::count(got["down"].tokens.begin(), got["down"].tokens.end(), 0), 0);
}

TEST(EngineTest, MaxTokensAndMaxModelLen) {
  FakeModelRunner runner(kVocab, 64, 4);
  EngineOptions o = fake_options();
  o.max_model_len = 20;
  Engine engine(o, &runner);
  EngineRequest a;
  a.request_id = "a";
  a.prompt_token_ids = {1, 2, 3};
  a.sampling.max_tokens = 7;
  a.sampling.ignore_eos = true;
  EngineRequest b = a;
  b.request_id = "b";
  b.prompt_token_ids.assign(15, 4);
  b.sampling.max_tokens = 100;
  ASSERT_TRUE(engine.add_request(a).is_ok());
  ASSERT_TRUE(engine.add_request(b).is_ok());
  auto got = run_all(engine);
  EXPECT_EQ(got["a"].tokens.size(), 7u);
  EXPECT_EQ(got["a"].reason, FinishReason::kLength);
  EXPECT_EQ(got["b"].tokens.size(), 5u);  // 15 + 5 = max_model_len
  EXPECT_EQ(got["b"].reason, FinishReason::kLength);
}

TEST(EngineTest, LogprobsPerToken) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  EngineRequest r;
  r.request_id = "r";
  r.prompt_token_ids = {1, 2, 3};
  r.sampling.max_tokens = 6;
  r.sampling.ignore_eos = true;
  r.sampling.temperature = 0;
  r.sampling.logprobs = 3;
  ASSERT_TRUE(engine.add_request(r).is_ok());
  Collected c = run_all(engine)["r"];
  ASSERT_EQ(c.logprobs.size(), 6u);
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    const TokenLogprobs& lp = c.logprobs[i];
    EXPECT_EQ(lp.sampled.token_id, c.tokens[i]);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].token_id, c.tokens[i]);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(lp.top[0].logprob, lp.sampled.logprob);
    EXPECT_LT(lp.sampled.logprob, 0.0f);
    EXPECT_GE(lp.top[0].logprob, lp.top[1].logprob);
  }
}

TEST(EngineTest, RunnerFailureFailsTheBatchAndEngineStaysUsable) {
  FakeModelRunner runner(kVocab, 64, 4);
  Engine engine(fake_options(), &runner);
  std::vector<EngineRequest> requests = mixed_requests(3, 5);
  for (const EngineRequest& r : requests) {
    ASSERT_TRUE(engine.add_request(r).is_ok());
  }
  runner.fail_on_call(1);
  auto got = run_all(engine);
  for (const EngineRequest& r : requests) {
    EXPECT_EQ(got[r.request_id].reason, FinishReason::kError) << r.request_id;
    EXPECT_NE(got[r.request_id].error.find("injected runner failure"), std::string::npos);
  }
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
  EngineRequest again = requests[0];
  again.request_id = "again";
  ASSERT_TRUE(engine.add_request(again).is_ok());
  expect_same(run_all(engine)["again"], run_alone(again), "again");
}

TEST(EngineTest, AddRequestRejectsBadRequests) {
  FakeModelRunner runner(kVocab, 64, 4);
  EngineOptions o = fake_options();
  o.max_model_len = 32;
  Engine engine(o, &runner);
  EngineRequest r;
  r.request_id = "r";
  r.prompt_token_ids = {1, 2};
  ASSERT_TRUE(engine.add_request(r).is_ok());
  EXPECT_EQ(engine.add_request(r).code(), StatusCode::kAlreadyExists);

  EngineRequest bad = r;
  bad.request_id = "bad";
  bad.prompt_token_ids.clear();
  EXPECT_EQ(engine.add_request(bad).code(), StatusCode::kInvalidArgument);
  bad.prompt_token_ids.assign(33, 1);
  Status s = engine.add_request(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("maximum context length of 32"), std::string::npos) << s.message();
  bad.prompt_token_ids = {kVocab};
  EXPECT_EQ(engine.add_request(bad).code(), StatusCode::kInvalidArgument);
  bad.prompt_token_ids = {1};
  bad.sampling.top_p = 0;
  s = engine.add_request(bad);
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s.message();
  bad.sampling = {};
  bad.sampling.max_tokens = 3;
  bad.sampling.min_tokens = 4;
  s = engine.add_request(bad);
  EXPECT_NE(s.message().find("min_tokens"), std::string::npos) << s.message();
  bad.sampling = {};
  bad.sampling.logit_bias = {{kVocab, 1.0f}};
  s = engine.add_request(bad);
  EXPECT_NE(s.message().find("logit_bias"), std::string::npos) << s.message();

  EngineOptions no_text = fake_options();
  no_text.make_detokenizer = nullptr;
  Engine engine2(no_text, &runner);
  EngineRequest with_stop = r;
  with_stop.sampling.stop = {"x"};
  EXPECT_EQ(engine2.add_request(with_stop).code(), StatusCode::kInvalidArgument);

  EngineOptions too_long = fake_options();
  too_long.max_model_len = 64 * 4 + 1;
  EXPECT_FALSE(Engine::validate_options(too_long, runner).is_ok());
  EngineOptions wrong_block = fake_options(8);
  EXPECT_FALSE(Engine::validate_options(wrong_block, runner).is_ok());
}

}  // namespace
}  // namespace crescent::engine
