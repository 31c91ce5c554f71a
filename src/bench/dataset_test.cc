// Random and ShareGPT prompts over a real tokenizer.json (the SentencePiece-style test
// tokenizer: 406 ids, 3 special, a BOS added by its post-processor).

#include "bench/dataset.h"

#include <gtest/gtest.h>

#include <set>

namespace crescent::bench {
namespace {

const model::Tokenizer& tokenizer() {
  static auto tok = model::Tokenizer::from_file(
      std::string(CRESCENT_SOURCE_DIR) + "/src/model/testdata/tokenizer/sp_bpe_tokenizer.json");
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return **tok;
}

TEST(RandomDatasetTest, PromptsHaveTheRequestedTokenCounts) {
  RandomDatasetOptions o;
  o.input_len = 33;  // minus the BOS the tokenizer adds: 32 tokens of text
  o.output_len = 7;
  auto r = sample_random(tokenizer(), 20, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 20u);
  std::set<std::string> distinct;
  for (const SampleRequest& s : *r) {
    auto ids = tokenizer().encode(s.prompt, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(static_cast<int64_t>(ids->size()), s.prompt_len);
    EXPECT_NEAR(static_cast<double>(s.prompt_len), 32, 2) << s.prompt;
    EXPECT_EQ(s.expected_output_len, 7);
    for (int32_t id : *ids) {
      EXPECT_FALSE(tokenizer().is_special(id)) << "special token " << id << " in " << s.prompt;
    }
    distinct.insert(s.prompt);
  }
  EXPECT_EQ(distinct.size(), 20u);  // every request has its own offset
}

TEST(RandomDatasetTest, RangeRatioSpreadsLengthsUniformly) {
  RandomDatasetOptions o;
  o.input_len = 21;  // 20 + BOS
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.seed = 3;
  auto r = sample_random(tokenizer(), 400, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::set<int64_t> outputs;
  int64_t min_in = 1 << 30, max_in = 0;
  for (const SampleRequest& s : *r) {
    EXPECT_GE(s.expected_output_len, 5);
    EXPECT_LE(s.expected_output_len, 15);
    outputs.insert(s.expected_output_len);
    min_in = std::min(min_in, s.prompt_len);
    max_in = std::max(max_in, s.prompt_len);
  }
  EXPECT_EQ(outputs.size(), 11u);  // every length in [5, 15] drawn at least once
  EXPECT_LE(min_in, 11);           // inputs span about [10, 30]
  EXPECT_GE(max_in, 29);
}

TEST(RandomDatasetTest, SharedPrefixAndSeed) {
  RandomDatasetOptions o;
  o.input_len = 9;
  o.output_len = 4;
  o.prefix_len = 16;
  o.seed = 5;
  auto a = sample_random(tokenizer(), 8, o);
  ASSERT_TRUE(a.is_ok());
  // All prompts start with the same text (the prefix's decoding, give or take the last
  // token, which may merge with the next).
  const std::string& first = (*a)[0].prompt;
  for (const SampleRequest& s : *a) {
    size_t common = 0;
    while (common < first.size() && common < s.prompt.size() && first[common] == s.prompt[common]) {
      ++common;
    }
    EXPECT_GE(common, first.size() / 2) << first << " | " << s.prompt;
    EXPECT_NEAR(static_cast<double>(s.prompt_len), 16 + 8, 2);
  }
  auto b = sample_random(tokenizer(), 8, o);
  ASSERT_TRUE(b.is_ok());
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
  }
  o.seed = 6;
  auto c = sample_random(tokenizer(), 8, o);
  ASSERT_TRUE(c.is_ok());
  EXPECT_NE((*a)[0].prompt, (*c)[0].prompt);
}

TEST(RandomDatasetTest, RefusesBadLengths) {
  RandomDatasetOptions o;
  o.range_ratio = 1.0;
  EXPECT_EQ(sample_random(tokenizer(), 1, o).status().code(), StatusCode::kInvalidArgument);
  o.range_ratio = 0;
  o.input_len = 1;  // only the BOS: no text tokens left
  auto r = sample_random(tokenizer(), 1, o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--random-input-len is too small"), std::string::npos);
  o.input_len = 8;
  o.output_len = -1;
  EXPECT_EQ(sample_random(tokenizer(), 1, o).status().code(), StatusCode::kInvalidArgument);
}

std::string conversation(const std::string& prompt, const std::string& answer) {
  return R"({"id":"x","conversations":[{"from":"human","value":")" + prompt +
         R"("},{"from":"gpt","value":")" + answer + R"("}]})";
}

TEST(ShareGptDatasetTest, FiltersShufflesAndOversamples) {
  const std::string long_text = "the quick brown fox jumps over the lazy dog again and again";
  std::string file = "[" + conversation(long_text, long_text) + "," +
                     conversation("hi", long_text) + "," +                      // prompt too short
                     conversation(long_text + " twice", "ok") + "," +           // answer too short
                     R"({"id":"y","conversations":[{"value":"one turn"}]},)" +  // one turn
                     R"({"id":"z"})" + "]";
  ShareGptOptions o;
  auto r = sample_sharegpt(tokenizer(), file, 5, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 5u);  // one usable pair, drawn again to make five
  auto ids = tokenizer().encode(long_text);
  ASSERT_TRUE(ids.is_ok());
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.prompt, long_text);
    EXPECT_EQ(s.prompt_len, static_cast<int64_t>(ids->size()));
    EXPECT_EQ(s.expected_output_len, static_cast<int64_t>(ids->size()));
  }
  // A fixed output length lifts the minimum-output rule: the "ok" answer's pair is kept too.
  o.output_len = 3;
  r = sample_sharegpt(tokenizer(), file, 2, o);
  ASSERT_TRUE(r.is_ok());
  std::set<std::string> prompts;
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.expected_output_len, 3);
    prompts.insert(s.prompt);
  }
  EXPECT_EQ(prompts.size(), 2u);
}

TEST(ShareGptDatasetTest, RefusesBadFiles) {
  ShareGptOptions o;
  EXPECT_EQ(sample_sharegpt(tokenizer(), "{not json", 1, o).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sample_sharegpt(tokenizer(), R"({"a":1})", 1, o).status().code(),
            StatusCode::kInvalidArgument);
  auto r = sample_sharegpt(tokenizer(), "[" + conversation("hi", "yo") + "]", 1, o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("fits the limits"), std::string::npos);
}

}  // namespace
}  // namespace crescent::bench
