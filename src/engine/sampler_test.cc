#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

namespace crescent::engine {
namespace {

// logits = log(probs): softmax gives the probabilities back exactly.
std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) {
    out.push_back(static_cast<float>(std::log(p)));
  }
  return out;
}

std::set<int32_t> sampled_set(const std::vector<float>& logits, const SamplingParams& p,
                              int num_draws = 4000) {
  Sampler sampler;
  Rng rng(7);
  std::set<int32_t> seen;
  for (int i = 0; i < num_draws; ++i) {
    seen.insert(sampler.sample(logits, p, rng, nullptr));
  }
  return seen;
}

const std::vector<double> kProbs = {0.05, 0.5, 0.1, 0.2, 0.15};  // order: 1, 3, 4, 2, 0

TEST(SamplingParamsTest, ValidateNamesTheBadField) {
  SamplingParams p;
  EXPECT_TRUE(validate(p, 100).is_ok());
  p.temperature = -1;
  Status s = validate(p, 100);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("temperature must be >= 0"), std::string::npos) << s.message();
  p = {};
  p.top_p = 0;
  EXPECT_NE(validate(p, 100).message().find("top_p must be in (0, 1]"), std::string::npos);
  p.top_p = 1.5f;
  EXPECT_FALSE(validate(p, 100).is_ok());
  p = {};
  p.top_k = -2;
  EXPECT_NE(validate(p, 100).message().find("top_k"), std::string::npos);
  p = {};
  p.min_p = 1.1f;
  EXPECT_NE(validate(p, 100).message().find("min_p"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(validate(p, 100).message().find("max_tokens"), std::string::npos);
  p = {};
  p.logprobs = 21;
  EXPECT_NE(validate(p, 100).message().find("logprobs"), std::string::npos);
  p = {};
  p.stop_token_ids = {100};
  EXPECT_NE(validate(p, 100).message().find("outside the vocabulary"), std::string::npos);
  p = {};
  p.stop = {""};
  EXPECT_FALSE(validate(p, 100).is_ok());
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(validate(p, 100).is_ok());
  p = {};
  p.max_tokens = 4;
  p.min_tokens = 4;
  EXPECT_TRUE(validate(p, 100).is_ok());
  p.min_tokens = 5;
  EXPECT_NE(validate(p, 100).message().find("min_tokens"), std::string::npos);
  p.min_tokens = -1;
  EXPECT_NE(validate(p, 100).message().find("min_tokens"), std::string::npos);
  p = {};
  p.logit_bias = {{3, -100.0f}, {99, 100.0f}};
  EXPECT_TRUE(validate(p, 100).is_ok());
  p.logit_bias = {{100, 1.0f}};
  EXPECT_NE(validate(p, 100).message().find("logit_bias token id 100"), std::string::npos);
  p.logit_bias = {{1, 100.5f}};
  EXPECT_NE(validate(p, 100).message().find("logit_bias values"), std::string::npos);
  p.logit_bias = {{1, NAN}};
  EXPECT_FALSE(validate(p, 100).is_ok());
  p.logit_bias = {{2, 1.0f}, {1, 1.0f}};
  EXPECT_NE(validate(p, 100).message().find("ordered"), std::string::npos);
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler sampler;
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, nullptr), 1);
  std::vector<float> tie = {0.0f, 3.0f, 1.0f, 3.0f};
  EXPECT_EQ(sampler.sample(tie, p, rng, nullptr), 1);
  p.temperature = 1.0f;
  p.top_k = 1;  // also greedy
  EXPECT_EQ(sampler.sample(tie, p, rng, nullptr), 1);
}

TEST(SamplerTest, TopKKeepsExactlyTheKBest) {
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3}));
  p.top_k = 3;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3, 4}));
  p.top_k = -1;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p).size(), 5u);
  p.top_k = 0;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p).size(), 5u);
  p.top_k = 50;  // larger than the vocabulary: off
  EXPECT_EQ(sampled_set(log_probs(kProbs), p).size(), 5u);
}

TEST(SamplerTest, TopPKeepsSmallestHeadReachingP) {
  SamplingParams p;
  p.top_p = 0.6f;  // 0.5 < 0.6 <= 0.7
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3}));
  p.top_p = 0.5f;  // the first token alone reaches it
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1}));
  p.top_p = 0.86f;  // 0.85 < 0.86 <= 0.95
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3, 4, 2}));
  // After top_k the mass is renormalised: {1, 3, 4} has 0.85; 0.5/0.85 = 0.588 < 0.6.
  p.top_k = 3;
  p.top_p = 0.6f;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3}));
}

TEST(SamplerTest, MinPIsRelativeToTheMostLikelyToken) {
  SamplingParams p;
  p.min_p = 0.3f;  // keeps p >= 0.15
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1, 3, 4}));
  p.min_p = 0.41f;  // keeps p >= 0.205
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1}));
  // Applied to the temperature-scaled distribution: T=0.5 squares the probabilities,
  // 0.2^2 / 0.5^2 = 0.16 < 0.3, so only token 1 stays.
  p.min_p = 0.3f;
  p.temperature = 0.5f;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{1}));
}

TEST(SamplerTest, TemperatureGivesTheExpectedDistribution) {
  Sampler sampler;
  Rng rng(12345);
  SamplingParams p;
  p.temperature = 0.5f;
  std::vector<double> expected;
  double z = 0;
  for (double q : kProbs) {
    expected.push_back(q * q);
    z += q * q;
  }
  const int n = 40000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    ++counts[sampler.sample(log_probs(kProbs), p, rng, nullptr)];
  }
  for (int v = 0; v < 5; ++v) {
    EXPECT_NEAR(counts[v] / static_cast<double>(n), expected[v] / z, 0.01) << "token " << v;
  }
  // Within top_k the proportions are kept: 0.5 : 0.2.
  p.temperature = 1.0f;
  p.top_k = 2;
  counts.clear();
  for (int i = 0; i < n; ++i) {
    ++counts[sampler.sample(log_probs(kProbs), p, rng, nullptr)];
  }
  EXPECT_NEAR(counts[1] / static_cast<double>(n), 0.5 / 0.7, 0.01);
}

TEST(SamplerTest, SameSeedSameTokens) {
  Sampler sampler;
  SamplingParams p;
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) {
    logits[i] = std::sin(i * 0.37f) * 3;
  }
  auto draw = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      out.push_back(sampler.sample(logits, p, rng, nullptr));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(SamplerTest, LogprobsComeFromTheUnmodifiedLogSoftmax) {
  Sampler sampler;
  Rng rng(3);
  SamplingParams p;
  p.temperature = 0.7f;  // must not affect the logprobs
  p.top_k = 2;
  p.logprobs = 3;
  std::vector<float> logits = log_probs(kProbs);
  for (float& l : logits) {
    l += 5.0f;  // a shift does not change the log-softmax
  }
  TokenLogprobs lp;
  int32_t token = sampler.sample(logits, p, rng, &lp);
  EXPECT_EQ(lp.sampled.token_id, token);
  EXPECT_NEAR(lp.sampled.logprob, std::log(kProbs[token]), 1e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token_id, 1);
  EXPECT_EQ(lp.top[1].token_id, 3);
  EXPECT_EQ(lp.top[2].token_id, 4);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.5), 1e-5);
  EXPECT_NEAR(lp.top[2].logprob, std::log(0.15), 1e-5);
  p.logprobs = 0;  // only the sampled token
  sampler.sample(logits, p, rng, &lp);
  EXPECT_TRUE(lp.top.empty());
}

TEST(SamplerTest, LogitBiasMovesTheChoiceNotTheLogprobs) {
  Sampler sampler;
  Rng rng(5);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  p.logit_bias = {{0, 100.0f}};  // the least likely token
  TokenLogprobs lp;
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, &lp), 0);
  // Logprobs are the model's (vLLM's raw logprobs), before the bias.
  EXPECT_NEAR(lp.sampled.logprob, std::log(kProbs[0]), 1e-5);
  EXPECT_EQ(lp.top[0].token_id, 1);
  // A small bias reorders the close ones: 3 (0.2) over 1 (0.5) needs > ln(2.5).
  p.logit_bias = {{3, 1.0f}};
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, nullptr), 3);
  p.logit_bias = {{3, 0.5f}};
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, nullptr), 1);
  // Random sampling: -100 bans a token for all practical purposes, +100 forces one.
  p = {};
  p.temperature = 1.0f;
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{0, 2, 4}));
  p.logit_bias = {{2, 100.0f}};
  p.top_k = 2;
  p.top_p = 0.9f;
  EXPECT_EQ(sampled_set(log_probs(kProbs), p), (std::set<int32_t>{2}));
}

TEST(SamplerTest, MaskedTokensAreNeverChosen) {
  Sampler sampler;
  Rng rng(6);
  SamplingParams p;
  p.temperature = 0;
  const std::vector<int32_t> mask = {1};
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, nullptr, mask), 3);
  // Over a +100 bias too: the mask is the last word.
  p.logit_bias = {{1, 100.0f}};
  EXPECT_EQ(sampler.sample(log_probs(kProbs), p, rng, nullptr, mask), 3);
  p = {};
  p.temperature = 1.5f;
  const std::vector<int32_t> two = {1, 4};
  Rng draw(8);
  std::set<int32_t> seen;
  for (int i = 0; i < 4000; ++i) {
    seen.insert(sampler.sample(log_probs(kProbs), p, draw, nullptr, two));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2, 3}));
}

TEST(SamplerTest, LargeVocabularyTopKTopP) {
  // A Qwen-sized row with a peaked head: the filters must find the head without mistakes.
  const int vocab = 151936;
  std::vector<float> logits(vocab, -10.0f);
  logits[777] = 10.0f;
  logits[5] = 9.0f;
  logits[150000] = 8.0f;
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(sampled_set(logits, p, 60), (std::set<int32_t>{5, 777}));
  p.top_k = 0;
  p.top_p = 0.99f;  // the three head tokens hold ~0.9998 of the mass
  std::set<int32_t> seen = sampled_set(logits, p, 60);
  EXPECT_TRUE(seen.count(777));
  for (int32_t t : seen) {
    EXPECT_TRUE(t == 777 || t == 5 || t == 150000) << t;
  }
}

TEST(SamplerTest, LargeVocabularyTemperatureMatchesTheSoftmax) {
  // Every token is a candidate (no top_k/top_p): the vector-exp path with chunked draws.
  const int vocab = 151936;
  std::vector<float> logits(vocab, -4.0f);
  logits[10] = 3.0f;
  logits[70000] = 2.5f;
  logits[151935] = 2.0f;  // in the last, partial chunk
  SamplingParams p;
  p.temperature = 0.7f;
  std::vector<double> weight(vocab);
  double total = 0;
  for (int i = 0; i < vocab; ++i) {
    weight[i] = std::exp((static_cast<double>(logits[i]) - 3.0) / 0.7);
    total += weight[i];
  }
  Sampler sampler;
  Rng rng(11);
  constexpr int kDraws = 5000;
  std::map<int32_t, int> count;
  int rest = 0;
  for (int i = 0; i < kDraws; ++i) {
    int32_t t = sampler.sample(logits, p, rng, nullptr);
    ASSERT_TRUE(t >= 0 && t < vocab) << t;
    if (t == 10 || t == 70000 || t == 151935) {
      ++count[t];
    } else {
      ++rest;
    }
  }
  auto expect_near_share = [&](int observed, double prob, const char* what) {
    const double sigma = std::sqrt(kDraws * prob * (1 - prob));
    EXPECT_NEAR(observed, kDraws * prob, 4.5 * sigma) << what;
  };
  expect_near_share(count[10], weight[10] / total, "token 10");
  expect_near_share(count[70000], weight[70000] / total, "token 70000");
  expect_near_share(count[151935], weight[151935] / total, "token 151935");
  expect_near_share(rest, 1 - (weight[10] + weight[70000] + weight[151935]) / total, "the rest");
}

TEST(SamplerTest, NanAndInfiniteLogitsAreNeverDrawn) {
  std::vector<float> logits(5000, 0.0f);
  for (int i = 0; i < 5000; i += 7) {
    logits[i] = std::nanf("");
  }
  for (int i = 3; i < 5000; i += 11) {
    logits[i] = -std::numeric_limits<float>::infinity();
  }
  SamplingParams p;
  p.temperature = 1.0f;
  for (int32_t t : sampled_set(logits, p, 3000)) {
    EXPECT_FALSE(std::isnan(logits[t]) || std::isinf(logits[t])) << t;
  }
  // One finite token among -inf: always it.
  std::vector<float> one(3000, -std::numeric_limits<float>::infinity());
  one[1234] = -50.0f;
  EXPECT_EQ(sampled_set(one, p, 50), (std::set<int32_t>{1234}));
  // min_p on the vocabulary path: only tokens within its ratio of the best.
  std::vector<float> head(200000, -20.0f);
  head[3] = 0.0f;
  head[199999] = std::log(0.5f);
  p.min_p = 0.3f;
  EXPECT_EQ(sampled_set(head, p, 400), (std::set<int32_t>{3, 199999}));
}

TEST(SamplerTest, AllowedTokensThatAreAllMaskedAndMinusInfStillDrawAtRandom) {
  // restrict_to() puts lowest() on them; times 1/T > 1 that overflows a float: the row takes
  // the double path and draws uniformly among them.
  std::vector<float> logits(5000, 1.0f);
  const std::vector<int32_t> allowed = {3, 9, 4999};
  for (int32_t id : allowed) {
    logits[id] = -std::numeric_limits<float>::infinity();
  }
  SamplingParams p;
  p.temperature = 0.5f;
  Sampler sampler;
  Rng rng(3);
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) {
    seen.insert(sampler.sample(logits, p, rng, nullptr, /*masked_token_ids=*/allowed, allowed));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{3, 9, 4999}));
}

TEST(SamplerTest, LargeVocabularyLogprobsMatchADoubleReference) {
  const int vocab = 151936;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) {
    logits[i] = static_cast<float>(std::sin(i * 0.37) * 6.0);
  }
  double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) {
    sum += std::exp(static_cast<double>(l) - max_logit);
  }
  const double log_z = max_logit + std::log(sum);
  Sampler sampler;
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  TokenLogprobs lp;
  int32_t t = sampler.sample(logits, p, rng, &lp);
  EXPECT_NEAR(lp.sampled.logprob, logits[t] - log_z, 2e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  for (const TokenLogprob& top : lp.top) {
    EXPECT_NEAR(top.logprob, logits[top.token_id] - log_z, 2e-5);
  }
}

}  // namespace
}  // namespace crescent::engine
