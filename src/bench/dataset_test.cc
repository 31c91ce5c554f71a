// Random and ShareGPT prompts over a real tokenizer.json (the SentencePiece-style test
// tokenizer: 406 ids, 3 special, a BOS added by its post-processor).

#include "bench/dataset.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string_view>

#include "media/decode.h"

namespace crescent::bench {
namespace {

const model::Tokenizer& model_tokenizer() {
  static auto tok = model::Tokenizer::from_file(
      std::string(CRESCENT_SOURCE_DIR) + "/src/model/testdata/tokenizer/sp_bpe_tokenizer.json");
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return **tok;
}

const PromptTokenizer& tokenizer() {
  // Not owning: model_tokenizer() lives as long as the test binary.
  static auto tok = local_prompt_tokenizer(
      std::shared_ptr<const model::Tokenizer>(&model_tokenizer(), [](const model::Tokenizer*) {}),
      "sp_bpe_tokenizer.json");
  return *tok;
}

// vLLM's prefix_repetition: num_requests / num_prefixes requests per prefix (10 / 3 -> 9), each
// exactly prefix + suffix tokens, the same prefix text within a group, shuffled.
TEST(PrefixRepetitionDatasetTest, GroupsShareTheirPrefixAndLengthsAreExact) {
  PrefixRepetitionOptions o;
  o.prefix_len = 24;
  o.suffix_len = 8;
  o.num_prefixes = 3;
  o.output_len = 5;
  o.seed = 3;
  auto r = sample_prefix_repetition(tokenizer(), 10, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 9u);
  std::map<std::string, int> groups;  // prefix ids -> requests
  std::vector<std::string> in_order;
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.prompt_len, 32) << s.prompt;
    EXPECT_EQ(s.expected_output_len, 5);
    auto ids = model_tokenizer().encode(s.prompt, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.is_ok());
    ASSERT_EQ(ids->size(), 32u) << s.prompt;
    std::string key;
    for (size_t i = 0; i < 20; ++i) {  // the boundary may re-tokenize; the head does not
      key += std::to_string((*ids)[i]) + ",";
    }
    ++groups[key];
    in_order.push_back(key);
  }
  ASSERT_EQ(groups.size(), 3u);
  for (const auto& [key, n] : groups) {
    EXPECT_EQ(n, 3);
  }
  EXPECT_FALSE(in_order[0] == in_order[1] && in_order[1] == in_order[2])
      << "shuffled, not grouped in order (seed 3)";
  auto again = sample_prefix_repetition(tokenizer(), 10, o);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ((*again)[4].prompt, (*r)[4].prompt) << "the same seed gives the same prompts";

  o.num_prefixes = 11;
  EXPECT_EQ(sample_prefix_repetition(tokenizer(), 10, o).status().code(),
            StatusCode::kInvalidArgument);
  o.num_prefixes = 2;
  o.output_len = 0;
  EXPECT_EQ(sample_prefix_repetition(tokenizer(), 10, o).status().code(),
            StatusCode::kInvalidArgument);
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
    auto ids = model_tokenizer().encode(s.prompt, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(static_cast<int64_t>(ids->size()), s.prompt_len);
    EXPECT_NEAR(static_cast<double>(s.prompt_len), 32, 2) << s.prompt;
    EXPECT_EQ(s.expected_output_len, 7);
    for (int32_t id : *ids) {
      EXPECT_FALSE(model_tokenizer().is_special(id))
          << "special token " << id << " in " << s.prompt;
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

TEST(RandomDatasetTest, SeveralPrefixesEachRepeated) {
  RandomDatasetOptions o;
  o.input_len = 6;
  o.output_len = 2;
  o.prefix_len = 24;
  o.num_prefixes = 3;
  o.seed = 1;
  auto r = sample_random(tokenizer(), 30, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // Prompts group by their first characters: 3 groups (each prefix's decoding starts alike).
  std::set<std::string> heads;
  for (const SampleRequest& s : *r) {
    heads.insert(s.prompt.substr(0, 12));
  }
  EXPECT_EQ(heads.size(), 3u);
  o.num_prefixes = 0;
  EXPECT_FALSE(sample_random(tokenizer(), 1, o).is_ok());
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
  auto ids = model_tokenizer().encode(long_text);
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

// ---- random-mm ----

std::string describe(const std::vector<ImageBucket>& buckets) {
  std::string text;
  for (const ImageBucket& b : buckets) {
    text += "(" + std::to_string(b.height) + "," + std::to_string(b.width) +
            ")=" + std::to_string(b.probability) + " ";
  }
  return text;
}

TEST(RandomMultiModalTest, ParsesVllmBucketConfigs) {
  // vLLM's default, with its zero-probability video bucket.
  auto r =
      parse_mm_bucket_config("{(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u) << describe(*r);
  EXPECT_EQ((*r)[0].height, 256);
  EXPECT_EQ((*r)[0].width, 256);
  EXPECT_DOUBLE_EQ((*r)[0].probability, 0.5);
  EXPECT_EQ((*r)[1].height, 720);
  EXPECT_EQ((*r)[1].width, 1280);
  EXPECT_DOUBLE_EQ((*r)[1].probability, 0.5);

  // Not summing to 1: scaled. No spaces, trailing commas, ints as probabilities.
  r = parse_mm_bucket_config("{(64,32,1):1,(16,16,1,):3,}");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].height, 64);
  EXPECT_EQ((*r)[0].width, 32);
  EXPECT_DOUBLE_EQ((*r)[0].probability, 0.25);
  EXPECT_DOUBLE_EQ((*r)[1].probability, 0.75);

  // Quoted keys (vLLM's parser takes them), '_' separators, exponents, newlines.
  r = parse_mm_bucket_config("{\n  '(1_024, 768, 1)': 2.5e-1,\n  \"(8, 8, 1)\": .75\n}");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].height, 1024);
  EXPECT_EQ((*r)[0].width, 768);
  EXPECT_DOUBLE_EQ((*r)[0].probability, 0.25);
  EXPECT_DOUBLE_EQ((*r)[1].probability, 0.75);

  // A repeated key keeps its place and takes the last value, as a Python dict does.
  r = parse_mm_bucket_config("{(1, 2, 1): 0.9, (3, 4, 1): 0.5, (1, 2, 1): 0.5}");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].height, 1);
  EXPECT_DOUBLE_EQ((*r)[0].probability, 0.5);

  // Zero-probability image buckets are dropped.
  r = parse_mm_bucket_config("{(10, 10, 1): 0, (20, 20, 1): 1}");
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].height, 20);
}

TEST(RandomMultiModalTest, RefusesBadBucketConfigs) {
  auto message = [](std::string_view text) {
    auto r = parse_mm_bucket_config(text);
    EXPECT_FALSE(r.is_ok()) << text;
    if (r.is_ok()) {
      return std::string();
    }
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(r.status().message().find("--random-mm-bucket-config"), std::string::npos);
    return r.status().message();
  };
  // Videos, with a clear word about why.
  std::string video = message("{(256, 256, 1): 0.5, (720, 1280, 16): 0.5}");
  EXPECT_NE(video.find("video"), std::string::npos) << video;
  EXPECT_NE(video.find("(720, 1280, 16)"), std::string::npos) << video;
  EXPECT_NE(message("{(256, 256, 0): 1}").find(">= 1"), std::string::npos);
  EXPECT_NE(message("{(0, 256, 1): 1}").find(">= 1"), std::string::npos);
  EXPECT_NE(message("{(-5, 256, 1): 1}").find(">= 1"), std::string::npos);
  EXPECT_NE(message("{(256, 256, 1): -0.5, (64, 64, 1): 1}").find("negative"), std::string::npos);
  EXPECT_NE(message("{(256, 256, 1): 0}").find("no image bucket"), std::string::npos);
  EXPECT_NE(message("{}").find("no image bucket"), std::string::npos);
  EXPECT_NE(message("{(256, 256): 1}").find("3 integers"), std::string::npos);
  EXPECT_NE(message("{(256, 256, 1, 1): 1}").find("3 integers"), std::string::npos);
  EXPECT_NE(message("{(256.0, 256, 1): 1}").find("integers"), std::string::npos);
  EXPECT_NE(message("{(100000, 100000, 1): 1}").find("pixels"), std::string::npos);
  message("");
  message("(256, 256, 1): 1");
  message("{(256, 256, 1) 1}");
  message("{(256, 256, 1): 1");
  message("{(256, 256, 1): 1} extra");
  message("{[256, 256, 1]: 1}");
  message("{(256, 256, 1): inf}");
  message("{(256, 256, 1): nan}");
  message("{(256, 256, 1): 0x10}");
  message("{(2__56, 256, 1): 1}");
  message("{(256_, 256, 1): 1}");
  message("{'(256, 256, 1): 1}");
  message("{(256, 256, 1): 1,, (8, 8, 1): 1}");
}

TEST(RandomMultiModalTest, ParsesTheImageLimit) {
  EXPECT_EQ(*parse_mm_limit_per_prompt("{\"image\": 3}"), 3);
  EXPECT_EQ(*parse_mm_limit_per_prompt("{\"image\": 0, \"video\": 1}"), 0);
  EXPECT_FALSE(parse_mm_limit_per_prompt("{\"video\": 1}").is_ok());
  EXPECT_FALSE(parse_mm_limit_per_prompt("{\"image\": -1}").is_ok());
  EXPECT_FALSE(parse_mm_limit_per_prompt("{\"image\": 1.5}").is_ok());
  EXPECT_FALSE(parse_mm_limit_per_prompt("image=3").is_ok());
  EXPECT_FALSE(parse_mm_limit_per_prompt("[3]").is_ok());
}

TEST(RandomMultiModalTest, ItemCountRangeIsVllms) {
  RandomMultiModalOptions o;
  o.base_items_per_request = 3;
  o.num_mm_items_range_ratio = 0.5;  // [floor(1.5), ceil(4.5)] = [1, 5]
  auto r = mm_items_range(o);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->first, 1);
  EXPECT_EQ(r->second, 5);
  o.image_limit = 4;  // the max is clamped to the limit
  EXPECT_EQ(mm_items_range(o)->second, 4);
  o.num_mm_items_range_ratio = 1;  // r = 1 allows 0
  EXPECT_EQ(mm_items_range(o)->first, 0);
  o.num_mm_items_range_ratio = 0;
  o.image_limit = 2;  // min 3 > max 2
  EXPECT_FALSE(mm_items_range(o).is_ok());
  o.image_limit = 255;
  o.num_mm_items_range_ratio = 1.5;
  EXPECT_FALSE(mm_items_range(o).is_ok());
  o.num_mm_items_range_ratio = 0;
  o.base_items_per_request = -1;
  EXPECT_FALSE(mm_items_range(o).is_ok());
}

TEST(RandomMultiModalTest, SamplesCountsAndBucketsDeterministically) {
  RandomMultiModalOptions o;
  o.base_items_per_request = 2;
  o.num_mm_items_range_ratio = 0.5;  // 1..3 images
  o.buckets = {{16, 32, 0.25}, {64, 8, 0.75}};
  o.seed = 42;
  auto a = sample_mm_image_sizes(4000, o);
  auto b = sample_mm_image_sizes(4000, o);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(*a, *b);
  std::map<int64_t, int> counts;
  int small = 0, total = 0;
  for (const auto& request : *a) {
    ++counts[static_cast<int64_t>(request.size())];
    for (const auto& [h, w] : request) {
      EXPECT_TRUE((h == 16 && w == 32) || (h == 64 && w == 8));
      small += h == 16 ? 1 : 0;
      ++total;
    }
  }
  EXPECT_EQ(counts.size(), 3u);
  for (const auto& [k, n] : counts) {
    EXPECT_GE(k, 1);
    EXPECT_LE(k, 3);
    EXPECT_NEAR(n, 4000 / 3, 150) << k;
  }
  EXPECT_NEAR(static_cast<double>(small) / total, 0.25, 0.03);
  o.seed = 43;
  EXPECT_NE(*sample_mm_image_sizes(4000, o), *a);
}

// Strict standard base64 back to bytes, for the round trip below.
std::vector<uint8_t> base64_decode(std::string_view text) {
  std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') {
      break;
    }
    acc = (acc << 6) | static_cast<uint32_t>(alphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  return out;
}

TEST(RandomMultiModalTest, AddsDistinctPngDataUrlsOfTheDrawnSizes) {
  auto text = sample_random(tokenizer(), 6, RandomDatasetOptions{17, 3, 0, 0, 5});
  ASSERT_TRUE(text.is_ok());
  RandomMultiModalOptions o;
  o.base_items_per_request = 2;
  o.num_mm_items_range_ratio = 0.5;
  o.buckets = {{24, 40, 0.5}, {33, 17, 0.5}};
  o.seed = 5;
  std::vector<SampleRequest> one_thread = *text, three_threads = *text;
  ASSERT_TRUE(add_random_images(&one_thread, o, 1).is_ok());
  ASSERT_TRUE(add_random_images(&three_threads, o, 3).is_ok());
  auto sizes = sample_mm_image_sizes(6, o);
  ASSERT_TRUE(sizes.is_ok());
  std::set<std::string> distinct;
  size_t num_images = 0;
  for (size_t i = 0; i < one_thread.size(); ++i) {
    EXPECT_EQ(one_thread[i].prompt, (*text)[i].prompt);  // the text is the random dataset's
    EXPECT_EQ(one_thread[i].image_urls, three_threads[i].image_urls);
    ASSERT_EQ(one_thread[i].image_urls.size(), (*sizes)[i].size());
    for (size_t k = 0; k < one_thread[i].image_urls.size(); ++k) {
      const std::string& url = one_thread[i].image_urls[k];
      const std::string prefix = "data:image/png;base64,";
      ASSERT_EQ(url.rfind(prefix, 0), 0u);
      std::vector<uint8_t> png = base64_decode(std::string_view(url).substr(prefix.size()));
      auto image = media::decode_image(png);
      ASSERT_TRUE(image.is_ok()) << image.status().to_string();
      EXPECT_EQ(image->height, (*sizes)[i][k].first);
      EXPECT_EQ(image->width, (*sizes)[i][k].second);
      distinct.insert(url);
      ++num_images;
    }
  }
  EXPECT_GE(num_images, 6u);
  EXPECT_EQ(distinct.size(), num_images);  // no two images alike: no server cache hits
}

}  // namespace
}  // namespace crescent::bench
