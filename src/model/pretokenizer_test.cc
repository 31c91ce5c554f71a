#include "model/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crescent::model {
namespace {

std::vector<std::string> split(SplitPattern p, std::string_view text) {
  std::vector<std::pair<size_t, size_t>> ranges;
  split_with_pattern(p, text, &ranges);
  std::vector<std::string> out;
  size_t expect = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, expect);
    expect = e;
    out.emplace_back(text.substr(b, e - b));
  }
  EXPECT_EQ(expect, text.size());
  return out;
}

using V = std::vector<std::string>;

TEST(PretokenizerTest, RecognisesKnownRegexesOnly) {
  EXPECT_EQ(
      recognize_split_pattern(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      SplitPattern::kQwen2);
  EXPECT_FALSE(recognize_split_pattern(R"(\w+)").has_value());
}

TEST(PretokenizerTest, Llama3Rules) {
  const auto p = SplitPattern::kLlama3;
  EXPECT_EQ(split(p, "Hello  world"), (V{"Hello", " ", " world"}));
  EXPECT_EQ(split(p, "I'M here'LL"), (V{"I", "'M", " here", "'LL"}));
  EXPECT_EQ(split(p, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split(p, "a \n\n b"), (V{"a", " \n\n", " b"}));
  EXPECT_EQ(split(p, "x!!\n\ny"), (V{"x", "!!\n\n", "y"}));
  EXPECT_EQ(split(p, " !? x"), (V{" !?", " x"}));
  EXPECT_EQ(split(p, "\tword"), (V{"\tword"}));
  EXPECT_EQ(split(p, "end   "), (V{"end", "   "}));
  EXPECT_EQ(split(p, "a 1"), (V{"a", " ", "1"}));
  // 'ſ' (long s) case-folds to 's' in Unicode case-insensitive matching.
  EXPECT_EQ(split(p, "it'\xC5\xBF"), (V{"it", "'\xC5\xBF"}));
  // U+0085 is White_Space: the regex engines HF uses treat it as \s.
  EXPECT_EQ(split(p,
                  "a\xC2\x85"
                  "b"),
            (V{"a",
               "\xC2\x85"
               "b"}));
}

TEST(PretokenizerTest, QwenSplitsDigitsSingly) {
  EXPECT_EQ(split(SplitPattern::kQwen2, "x123"), (V{"x", "1", "2", "3"}));
}

TEST(PretokenizerTest, Gpt2Rules) {
  const auto p = SplitPattern::kGpt2;
  EXPECT_EQ(split(p, "Hello world's 123 !!"), (V{"Hello", " world", "'s", " 123", " !!"}));
  EXPECT_EQ(split(p, "I'M"), (V{"I", "'", "M"}));
  EXPECT_EQ(split(p, "a  \n b"), (V{"a", "  \n", " b"}));
}

}  // namespace
}  // namespace crescent::model
