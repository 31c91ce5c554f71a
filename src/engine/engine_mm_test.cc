// The engine with images: encoder cache reuse, the encoder budget per step, chunks that split
// an image, the prefix cache keyed by image content, M-RoPE positions, and failures.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace crescent::engine::testing {
namespace {

constexpr int32_t kPad = 45;  // the image placeholder token in these tests
constexpr int kHidden = 2;

// Row r of the image whose first pixel is p: {p * 1e4 + r, -1}. The runner below checks that
// every placeholder row it is handed carries the row of its own position.
class FakeEncoder : public EncoderRunner {
 public:
  int hidden_size() const override { return kHidden; }
  int num_tokens(int t, int h, int w) const override { return t * h * w / 4; }
  Result<std::vector<float>> encode(const EncoderInput& input) override {
    ++num_calls;
    if (input.pixel_values.empty() || input.pixel_values[0] < 0) {
      return invalid_argument("bad pixels");
    }
    const int n = num_tokens(input.grid_t, input.grid_h, input.grid_w);
    std::vector<float> out(static_cast<size_t>(n) * kHidden, -1.0f);
    for (int r = 0; r < n; ++r) {
      out[static_cast<size_t>(r) * kHidden] = input.pixel_values[0] * 1e4f + static_cast<float>(r);
    }
    return out;
  }
  int num_calls = 0;
};

struct SeenRow {
  int64_t index;  // token index in its sequence
  float value;
};

class RecordingRunner : public FakeModelRunner {
 public:
  using FakeModelRunner::FakeModelRunner;
  Status execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) override {
    int64_t encoder_rows = 0;
    for (const RunnerSeq& s : batch) {
      for (const InputEmbeddings& e : s.embeddings) {
        for (int64_t i = 0; i < e.num_rows; ++i) {
          const int64_t index = s.start_pos + e.row + i;
          EXPECT_EQ(s.token_ids[static_cast<size_t>(e.row + i)], kPad) << "index " << index;
          rows.push_back({index, e.data[i * kHidden]});
        }
        encoder_rows += e.num_rows;
      }
      if (!s.positions3.empty()) {
        EXPECT_EQ(s.positions3.size(), 3 * s.token_ids.size());
        for (size_t i = 0; i < s.token_ids.size(); ++i) {
          positions[s.start_pos + static_cast<int64_t>(i)] = {
              s.positions3[3 * i], s.positions3[3 * i + 1], s.positions3[3 * i + 2]};
        }
      }
    }
    max_rows_per_step = std::max(max_rows_per_step, encoder_rows);
    return FakeModelRunner::execute(batch, logits);
  }
  std::vector<SeenRow> rows;
  std::map<int64_t, std::array<int32_t, 3>> positions;
  int64_t max_rows_per_step = 0;
};

// An image of grid 1 x (2h) x (2w) ViT patches = h x w placeholder tokens, identified by `id`.
MultiModalItem image(float id, int offset, int h, int w) {
  auto input = std::make_shared<EncoderInput>();
  input->pixel_values.assign(static_cast<size_t>(4 * h * w) * 8, id);
  input->grid_t = 1;
  input->grid_h = 2 * h;
  input->grid_w = 2 * w;
  MultiModalItem item;
  item.mm_hash = "img-" + std::to_string(id);
  item.offset = offset;
  item.num_tokens = h * w;
  item.llm_grid_h = h;
  item.llm_grid_w = w;
  item.input = std::move(input);
  return item;
}

// "ab" + pads + "cd..." with the image at offset 2.
EngineRequest request(const std::string& id, std::vector<MultiModalItem> items,
                      const std::string& tail = "cdefg", int max_tokens = 3) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = toks("ab");
  for (const auto& item : items) {
    r.prompt_token_ids.resize(static_cast<size_t>(item.offset), tok('x'));
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), static_cast<size_t>(item.num_tokens), kPad);
  }
  const auto t = toks(tail);
  r.prompt_token_ids.insert(r.prompt_token_ids.end(), t.begin(), t.end());
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  r.mm_items = std::move(items);
  return r;
}

struct MmEngine {
  explicit MmEngine(int max_batched = 64, int encoder_per_step = 0, int64_t cache_tokens = 64,
                    int num_blocks = 64)
      : runner(kVocab, num_blocks, 4) {
    EngineOptions o = fake_options(4);
    o.max_num_batched_tokens = max_batched;
    o.encoder_runner = &encoder;
    o.encoder_cache_tokens = cache_tokens;
    o.max_num_encoder_tokens_per_step = encoder_per_step;
    engine = std::make_unique<Engine>(o, &runner);
  }
  // Every placeholder row the runner saw carried its own image row.
  void expect_rows_match(const std::vector<std::pair<int, float>>& offsets_and_ids) {
    for (const SeenRow& row : runner.rows) {
      bool matched = false;
      for (auto [offset, id] : offsets_and_ids) {
        if (row.value == id * 1e4f + static_cast<float>(row.index - offset)) {
          matched = true;
        }
      }
      EXPECT_TRUE(matched) << "row at index " << row.index << " got " << row.value;
    }
  }
  FakeEncoder encoder;
  RecordingRunner runner;
  std::unique_ptr<Engine> engine;
};

TEST(EngineMmTest, SameImageIsEncodedOnceAndSharesPrefixBlocks) {
  MmEngine m;
  ASSERT_TRUE(m.engine->add_request(request("a", {image(3, 2, 2, 3)})).is_ok());
  auto first = run_all(*m.engine);
  ASSERT_TRUE(m.engine->add_request(request("b", {image(3, 2, 2, 3)})).is_ok());
  auto second = run_all(*m.engine);
  EXPECT_EQ(m.encoder.num_calls, 1);
  EXPECT_EQ(first["a"].tokens, second["b"].tokens);
  // 2 text + 6 image + 5 text = 13 tokens: the three full blocks of 4 come from the cache.
  EXPECT_EQ(second["b"].num_cached_tokens, 12);
  m.expect_rows_match({{2, 3}});
  const EngineStats s = m.engine->stats();
  EXPECT_EQ(s.num_images_encoded_total, 1);
  EXPECT_EQ(s.encoder_cache.num_referenced, 0);
  EXPECT_EQ(s.encoder_cache.num_entries, 1);
}

TEST(EngineMmTest, SameTextWithAnotherImageSharesOnlyTheBlocksBeforeIt) {
  MmEngine m;
  ASSERT_TRUE(m.engine->add_request(request("a", {image(3, 4, 2, 2)})).is_ok());
  run_all(*m.engine);
  ASSERT_TRUE(m.engine->add_request(request("b", {image(5, 4, 2, 2)})).is_ok());
  auto second = run_all(*m.engine);
  EXPECT_EQ(m.encoder.num_calls, 2);
  // The image starts at token 4: only block 0 ("ab" + 2 filler) is shared.
  EXPECT_EQ(second["b"].num_cached_tokens, 4);
  m.expect_rows_match({{4, 3}, {4, 5}});
}

TEST(EngineMmTest, ChunksSplitInsideAnImage) {
  MmEngine m(/*max_batched=*/3);
  ASSERT_TRUE(m.engine->add_request(request("a", {image(7, 2, 3, 3)})).is_ok());
  auto out = run_all(*m.engine);
  EXPECT_EQ(out["a"].tokens.size(), 3u);
  EXPECT_EQ(m.encoder.num_calls, 1);
  ASSERT_EQ(m.runner.rows.size(), 9u);  // each image row handed over exactly once
  m.expect_rows_match({{2, 7}});
  // Same tokens as one unchunked run.
  MmEngine whole;
  ASSERT_TRUE(whole.engine->add_request(request("a", {image(7, 2, 3, 3)})).is_ok());
  EXPECT_EQ(run_all(*whole.engine)["a"].tokens, out["a"].tokens);
}

TEST(EngineMmTest, EncoderBudgetSpreadsImagesOverSteps) {
  MmEngine m(/*max_batched=*/64, /*encoder_per_step=*/4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        m.engine->add_request(request("r" + std::to_string(i), {image(10 + i, 2, 2, 2)})).is_ok());
  }
  auto out = run_all(*m.engine);
  EXPECT_EQ(m.encoder.num_calls, 3);
  EXPECT_LE(m.runner.max_rows_per_step, 4);  // one 4-row image per step
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out["r" + std::to_string(i)].tokens.size(), 3u);
  }
}

TEST(EngineMmTest, AnImageLargerThanTheStepBudgetStillRuns) {
  MmEngine m(/*max_batched=*/64, /*encoder_per_step=*/2);
  ASSERT_TRUE(m.engine->add_request(request("a", {image(4, 2, 3, 3)})).is_ok());
  EXPECT_EQ(run_all(*m.engine)["a"].tokens.size(), 3u);
}

TEST(EngineMmTest, MropePositionsFollowTheImageGrid) {
  MmEngine m;
  // "ab" (0, 1), image 2x3 at (2 + h, 2 + w), then text from 2 + max(1, 2, 3) = 5.
  ASSERT_TRUE(m.engine->add_request(request("a", {image(1, 2, 2, 3)}, "cd", 2)).is_ok());
  run_all(*m.engine);
  const auto& p = m.runner.positions;
  EXPECT_EQ(p.at(0), (std::array<int32_t, 3>{0, 0, 0}));
  EXPECT_EQ(p.at(2), (std::array<int32_t, 3>{2, 2, 2}));
  EXPECT_EQ(p.at(4), (std::array<int32_t, 3>{2, 2, 4}));
  EXPECT_EQ(p.at(7), (std::array<int32_t, 3>{2, 3, 4}));
  EXPECT_EQ(p.at(8), (std::array<int32_t, 3>{5, 5, 5}));   // "c"
  EXPECT_EQ(p.at(9), (std::array<int32_t, 3>{6, 6, 6}));   // "d"
  EXPECT_EQ(p.at(10), (std::array<int32_t, 3>{7, 7, 7}));  // first output token: 10 + delta
}

TEST(EngineMmTest, MropePositionsMatchGetRopeIndex) {
  // Two images; values worked out by hand from transformers' get_rope_index.
  std::vector<MultiModalItem> items = {image(1, 1, 1, 2), image(2, 4, 2, 1)};
  int delta = 0;
  std::vector<int32_t> p = mrope_positions(7, items, &delta);
  const std::vector<int32_t> expected = {0, 0, 0,           // text
                                         1, 1, 1, 1, 1, 2,  // image 1 (1 x 2)
                                         3, 3, 3,           // text at 1 + max(1, 1, 2)
                                         4, 4, 4, 4, 5, 4,  // image 2 (2 x 1)
                                         6, 6, 6};          // text at 4 + 2
  EXPECT_EQ(p, expected);
  EXPECT_EQ(delta, 0);
}

TEST(EngineMmTest, RefusalsNameTheProblem) {
  MmEngine m(/*max_batched=*/64, 0, /*cache_tokens=*/8);
  Status too_big = m.engine->add_request(request("a", {image(1, 2, 3, 3)}));
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("encoder cache"), std::string::npos) << too_big.to_string();
  MultiModalItem bad = image(1, 2, 2, 2);
  bad.num_tokens = 5;
  EXPECT_EQ(m.engine->add_request(request("b", {bad})).code(), StatusCode::kInvalidArgument);

  FakeModelRunner runner(kVocab, 64, 4);
  Engine text_only(fake_options(4), &runner);
  Status refused = text_only.add_request(request("c", {image(1, 2, 2, 2)}));
  EXPECT_NE(refused.message().find("does not take images"), std::string::npos)
      << refused.to_string();
}

TEST(EngineMmTest, EncoderFailureFailsOnlyThatRequest) {
  MmEngine m;
  ASSERT_TRUE(m.engine->add_request(request("bad", {image(-1, 2, 2, 2)})).is_ok());
  ASSERT_TRUE(m.engine->add_request(request("good", {image(2, 2, 2, 2)})).is_ok());
  auto out = run_all(*m.engine);
  EXPECT_EQ(out["bad"].reason, FinishReason::kError);
  EXPECT_NE(out["bad"].error.find("bad pixels"), std::string::npos) << out["bad"].error;
  EXPECT_EQ(out["good"].tokens.size(), 3u);
  EXPECT_EQ(m.engine->stats().encoder_cache.num_referenced, 0);
}

TEST(EngineMmTest, PreemptionAndAbortReleaseTheirReferences) {
  // 14 blocks of 4 tokens: three long requests cannot all stay resident.
  MmEngine m(/*max_batched=*/64, 0, /*cache_tokens=*/64, /*num_blocks=*/14);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m.engine
                    ->add_request(
                        request("r" + std::to_string(i), {image(20 + i, 2, 2, 2)}, "cdefghij", 12))
                    .is_ok());
  }
  ASSERT_TRUE(m.engine->add_request(request("gone", {image(30, 2, 2, 2)})).is_ok());
  m.engine->abort("gone");
  auto out = run_all(*m.engine);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out["r" + std::to_string(i)].tokens.size(), 12u);
  }
  EXPECT_GT(m.engine->stats().num_preemptions_total, 0);
  EXPECT_EQ(m.engine->stats().encoder_cache.num_referenced, 0);
  m.expect_rows_match({{2, 20}, {2, 21}, {2, 22}});
}

}  // namespace
}  // namespace crescent::engine::testing
