// End-to-end checks of the engine on real model files made by `crescent make-model`:
// logits against an independent double-precision forward pass, and the equivalences that
// paging, batching, chunking, prefix caching and preemption must preserve.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/loader.h"
#include "engine/transformer_runner.h"
#include "kernels/kernels.h"
#include "model/model_files.h"
#include "testing/reference_forward.h"
#include "testing/test_models.h"

namespace crescent {
namespace {

using engine::EngineRequest;
using engine::LoadedEngine;
using model::TransformerOptions;

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

std::unique_ptr<LoadedEngine> load(const std::string& path, TransformerOptions::Weights w,
                                   int num_blocks = 0, int max_batched_tokens = 2048,
                                   bool prefix_caching = true) {
  engine::LoadOptions o;
  o.model_path = path;
  o.transformer.weights = w;
  o.kv_cache.num_blocks = num_blocks;
  o.kv_cache.kv_cache_bytes = 64 << 20;
  o.max_num_batched_tokens = max_batched_tokens;
  o.enable_prefix_caching = prefix_caching;
  auto loaded = engine::load_engine(o, pool());
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  return loaded.is_ok() ? std::move(*loaded) : nullptr;
}

std::vector<int32_t> make_prompt(int len, uint32_t seed, int vocab = 150000) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (auto& id : ids)
    id = d(rng);
  return ids;
}

// Runs the runner directly (no scheduler) over a whole prompt and returns logits per call.
std::vector<float> run_logits(engine::TransformerRunner& runner, const std::vector<int32_t>& tokens,
                              int64_t start_pos, const std::vector<int32_t>& table) {
  std::vector<float> logits;
  engine::RunnerSeq seq{tokens, start_pos, table, true};
  Status s = runner.execute(std::span<const engine::RunnerSeq>(&seq, 1), logits);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i)
    m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a)
    m = std::max(m, std::abs(v));
  return m;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

// Prefill of a 37-token prompt (3 blocks, the last partial) and 5 decode steps, each step's
// logits against the double-precision reference over the whole sequence.
TEST_P(ReferenceTest, LogitsMatchDoublePrecisionReference) {
  const std::string dir = testing::ensure_test_model(GetParam());
  for (auto weights : {TransformerOptions::Weights::kF32, TransformerOptions::Weights::kBF16}) {
    auto loaded = load(dir, weights);
    ASSERT_NE(loaded, nullptr);
    auto files = model::open_model(dir);
    ASSERT_TRUE(files.is_ok()) << files.status().to_string();
    const int vocab = loaded->model->config().vocab_size;
    std::vector<int32_t> tokens = make_prompt(37, 7, std::min(vocab, 120000));
    std::vector<int32_t> table = {3, 0, 5, 1};  // deliberately not in order
    // The engine runs the prefill and 5 greedy decode steps; then one reference pass over the
    // whole sequence gives every position's logits (causality makes them comparable).
    std::vector<std::vector<float>> steps;
    steps.push_back(run_logits(*loaded->runner, tokens, 0, table));
    for (int step = 0; step < 5; ++step) {
      const auto& last = steps.back();
      auto next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      tokens.push_back(next);
      steps.push_back(
          run_logits(*loaded->runner, {next}, static_cast<int64_t>(tokens.size()) - 1, table));
    }
    auto ref = testing::reference_logits(*files, tokens);
    // F32 matrices differ from the reference only by float rounding; BF16 paths may round
    // activations to BF16 before the multiply.
    const double tol = weights == TransformerOptions::Weights::kF32 ? 2e-4 : 3e-2;
    for (size_t step = 0; step < steps.size(); ++step) {
      const auto& expected = ref[37 - 1 + step];
      const double scale = std::max(1.0, max_abs(expected));
      ASSERT_LE(max_abs_diff(steps[step], expected), tol * scale)
          << GetParam() << " step " << step << " weights " << static_cast<int>(weights);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, ReferenceTest,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-llama"));

TEST(ModelEngineTest, ChunkedPrefillLogitsEqualWholePrefill) {
  auto loaded = load(testing::ensure_test_model("tiny"), TransformerOptions::Weights::kF32);
  ASSERT_NE(loaded, nullptr);
  std::vector<int32_t> tokens = make_prompt(45, 3);
  std::vector<int32_t> table = {0, 1, 2};
  auto whole = run_logits(*loaded->runner, tokens, 0, table);
  std::vector<int32_t> table2 = {4, 6, 5};
  run_logits(*loaded->runner, {tokens.begin(), tokens.begin() + 7}, 0, table2);
  run_logits(*loaded->runner, {tokens.begin() + 7, tokens.begin() + 30}, 7, table2);
  auto chunked = run_logits(*loaded->runner, {tokens.begin() + 30, tokens.end()}, 30, table2);
  ASSERT_EQ(whole.size(), chunked.size());
  for (size_t i = 0; i < whole.size(); ++i)
    ASSERT_NEAR(whole[i], chunked[i], 1e-4) << i;
}

// Greedy outputs of a set of requests through the engine.
std::map<std::string, std::vector<int32_t>> generate_all(LoadedEngine& loaded,
                                                         const std::vector<EngineRequest>& reqs,
                                                         bool one_at_a_time,
                                                         engine::EngineStats* stats_out = nullptr) {
  engine::Engine eng(loaded.engine_options, loaded.runner.get());
  std::map<std::string, std::vector<int32_t>> out;
  auto drain = [&] {
    while (eng.has_unfinished_requests()) {
      auto step = eng.step();
      EXPECT_TRUE(step.is_ok()) << step.status().to_string();
      if (!step.is_ok())
        return;
      for (const auto& o : *step) {
        auto& v = out[o.request_id];
        v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
    }
  };
  for (const auto& r : reqs) {
    EXPECT_TRUE(eng.add_request(r).is_ok());
    if (one_at_a_time)
      drain();
  }
  drain();
  if (stats_out)
    *stats_out = eng.stats();
  EXPECT_EQ(eng.stats().num_blocks_used, 0) << "blocks left in use";
  return out;
}

std::vector<EngineRequest> greedy_requests(int n, int max_tokens, uint32_t seed,
                                           const std::vector<int32_t>& shared_prefix = {}) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = shared_prefix;
    auto tail = make_prompt(5 + 11 * i % 40, seed + i);
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(ModelEngineTest, BatchedEqualsOneAtATime) {
  auto loaded = load(testing::ensure_test_model("tiny"), TransformerOptions::Weights::kF32);
  ASSERT_NE(loaded, nullptr);
  auto reqs = greedy_requests(6, 12, 100);
  EXPECT_EQ(generate_all(*loaded, reqs, true), generate_all(*loaded, reqs, false));
}

TEST(ModelEngineTest, ChunkedPrefillEqualsWholePrefill) {
  const std::string dir = testing::ensure_test_model("tiny");
  auto whole = load(dir, TransformerOptions::Weights::kF32, 0, 2048);
  auto chunked = load(dir, TransformerOptions::Weights::kF32, 0, 16);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(chunked, nullptr);
  auto reqs = greedy_requests(4, 10, 200);
  EXPECT_EQ(generate_all(*whole, reqs, false), generate_all(*chunked, reqs, false));
}

TEST(ModelEngineTest, PrefixCacheHitEqualsMiss) {
  const std::string dir = testing::ensure_test_model("tiny");
  auto cached = load(dir, TransformerOptions::Weights::kF32, 0, 2048, true);
  auto uncached = load(dir, TransformerOptions::Weights::kF32, 0, 2048, false);
  ASSERT_NE(cached, nullptr);
  ASSERT_NE(uncached, nullptr);
  auto reqs = greedy_requests(5, 8, 300, make_prompt(40, 9));
  engine::EngineStats stats;
  auto with_cache = generate_all(*cached, reqs, true, &stats);
  EXPECT_GE(stats.prefix_cache_hits_tokens, 4 * 32)
      << "later requests must hit the shared 2 blocks";
  EXPECT_EQ(with_cache, generate_all(*uncached, reqs, true));
}

TEST(ModelEngineTest, PreemptionAndRecomputeEqualsUninterrupted) {
  const std::string dir = testing::ensure_test_model("tiny");
  auto roomy = load(dir, TransformerOptions::Weights::kF32, 256);
  auto tight = load(dir, TransformerOptions::Weights::kF32, 12);  // 192 tokens for 6 requests
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(tight, nullptr);
  auto reqs = greedy_requests(6, 30, 400);
  EXPECT_EQ(generate_all(*roomy, reqs, false), generate_all(*tight, reqs, false));
}

TEST(ModelEngineTest, SafetensorsAndGgufGenerateTheSameTokens) {
  const std::string dir = testing::ensure_test_model("tiny");
  auto st = load(dir, TransformerOptions::Weights::kAuto);
  auto gguf = load(dir + "/model.gguf", TransformerOptions::Weights::kAuto);
  ASSERT_NE(st, nullptr);
  ASSERT_NE(gguf, nullptr);
  auto reqs = greedy_requests(3, 16, 500);
  EXPECT_EQ(generate_all(*st, reqs, false), generate_all(*gguf, reqs, false));
}

TEST(ModelEngineTest, EveryIsaAgreesWithPortable) {
  auto loaded = load(testing::ensure_test_model("tiny"), TransformerOptions::Weights::kBF16);
  ASSERT_NE(loaded, nullptr);
  std::vector<int32_t> tokens = make_prompt(33, 11);
  std::vector<int32_t> table = {0, 1, 2};
  const kernels::Isa original = kernels::active_isa();
  ASSERT_TRUE(kernels::set_active_isa(kernels::Isa::kPortable).is_ok());
  auto portable = run_logits(*loaded->runner, tokens, 0, table);
  for (auto isa : {kernels::Isa::kAvx2, kernels::Isa::kAvx512, kernels::Isa::kAvx512Bf16}) {
    if (!kernels::set_active_isa(isa).is_ok())
      continue;  // CPU lacks it
    auto got = run_logits(*loaded->runner, tokens, 0, table);
    double scale = 1, diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(portable[i])));
      diff = std::max(diff, static_cast<double>(std::abs(got[i] - portable[i])));
    }
    EXPECT_LE(diff, 3e-2 * scale) << kernels::isa_name(isa);
    EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
              std::max_element(portable.begin(), portable.end()) - portable.begin())
        << kernels::isa_name(isa);
  }
  ASSERT_TRUE(kernels::set_active_isa(original).is_ok());
}

TEST(ModelEngineTest, PromptLongerThanContextIsAClearError) {
  auto loaded = load(testing::ensure_test_model("tiny"), TransformerOptions::Weights::kAuto);
  ASSERT_NE(loaded, nullptr);
  engine::Engine eng(loaded->engine_options, loaded->runner.get());
  EngineRequest r;
  r.request_id = "too-long";
  r.prompt_token_ids = make_prompt(loaded->engine_options.max_model_len + 1, 1);
  Status s = eng.add_request(r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("max"), std::string::npos) << s.message();
  EXPECT_FALSE(eng.has_unfinished_requests());
}

TEST(ModelEngineTest, BadModelFilesAreClearErrors) {
  namespace fs = std::filesystem;
  const std::string dir = testing::ensure_test_model("tiny");
  const fs::path bad = fs::path(CRESCENT_BINARY_DIR) / ("bad-model-" + std::to_string(::getpid()));
  fs::remove_all(bad);
  fs::create_directories(bad);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(dir) / f, bad / f);
  }
  // A truncated safetensors file.
  {
    std::ifstream in(fs::path(dir) / "model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(bad / "model.safetensors", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  engine::LoadOptions o;
  o.model_path = bad.string();
  auto r = engine::load_engine(o, pool());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos)
      << r.status().to_string();
  // An unknown architecture.
  {
    std::ifstream in(fs::path(dir) / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), {});
    auto pos = cfg.find("Qwen3ForCausalLM");
    ASSERT_NE(pos, std::string::npos);
    cfg.replace(pos, 16, "GPTNeoXForCausalLM");
    std::ofstream(bad / "config.json") << cfg;
  }
  r = engine::load_engine(o, pool());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().to_string();
  EXPECT_NE(r.status().message().find("GPTNeoXForCausalLM"), std::string::npos);
  fs::remove_all(bad);
}

}  // namespace
}  // namespace crescent
