#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "model/make_model.h"
#include "model/presets.h"
#include "model/safetensors.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

// A byte-level BPE tokenizer.json small enough to parse instantly.
constexpr const char* kTinyTokenizer = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3},
            "merges": ["a b", ["\u0120", "a"]]},
  "added_tokens": [{"id": 500, "content": "<|end|>", "special": true},
                   {"id": 501, "content": "<think>", "special": false}],
  "decoder": {"type": "ByteLevel"}})";

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterised test's name holds a '/' ("Name/3"); as a path it would nest the dir in a
    // parent that TearDown never removes.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ =
        fs::path(::testing::TempDir()) / ("gguf_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A preset shrunk to a 512-token vocabulary, written as F32 safetensors.
  ModelConfig write_source(const std::string& preset, const std::string& file) {
    ModelConfig c = find_model_preset(preset)->config;
    c.vocab_size = 512;
    c.bos_token_id = 500;
    c.eos_token_ids = {500, 501};
    c.torch_dtype = "float32";
    std::vector<std::vector<float>> data;
    std::vector<TensorView> views;
    for (const TensorSpec& s : model_tensor_specs(c)) {
      int64_t n = 1;
      for (int64_t d : s.shape)
        n *= d;
      data.emplace_back(static_cast<size_t>(n));
      generate_weights(c, s, /*seed=*/7, 0, n, data.back().data());
      views.push_back({s.name, DType::kF32, s.shape, data.back().data(), n * 4});
    }
    EXPECT_TRUE(write_safetensors(path(file), views).is_ok());
    return c;
  }

  fs::path dir_;
};

TEST(GgufNamesTest, MapsBothWays) {
  const std::pair<const char*, const char*> pairs[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
      {"blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"},
      {"blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"},
      {"blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"},
      {"blk.2.ffn_gate.weight", "model.layers.2.mlp.gate_proj.weight"},
      {"blk.2.ffn_up.weight", "model.layers.2.mlp.up_proj.weight"},
      {"blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"},
      {"blk.27.attn_norm.weight", "model.layers.27.input_layernorm.weight"},
      {"blk.27.ffn_norm.weight", "model.layers.27.post_attention_layernorm.weight"},
  };
  for (const auto& [g, h] : pairs) {
    EXPECT_EQ(gguf_to_hf_name(g), std::optional<std::string>(h)) << g;
    EXPECT_EQ(hf_to_gguf_name(h), std::optional<std::string>(g)) << h;
  }
  EXPECT_EQ(gguf_to_hf_name("rope_freqs.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.x.attn_q.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.01.attn_q.weight"), std::nullopt);
  EXPECT_EQ(hf_to_gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"), std::nullopt);
}

TEST(GgufNamesTest, LlamaQkPermutationMatchesLlamaCpp) {
  // llama.cpp: w.reshape(heads, 2, hd/2, ...).swapaxes(1, 2).reshape(...): with 2 heads of
  // head_dim 4, GGUF rows hold HF rows 0 2 1 3 | 4 6 5 7.
  const int64_t expected[] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t g = 0; g < 8; ++g)
    EXPECT_EQ(llama_qk_hf_row(g, 8, 2), expected[g]) << g;
  ModelConfig llama = find_model_preset("tiny-llama")->config;
  EXPECT_EQ(gguf_qk_permute_heads(llama, "model.layers.0.self_attn.q_proj.weight"), 4);
  EXPECT_EQ(gguf_qk_permute_heads(llama, "model.layers.0.self_attn.k_proj.weight"), 2);
  EXPECT_EQ(gguf_qk_permute_heads(llama, "model.layers.0.self_attn.v_proj.weight"), 0);
  ModelConfig qwen = find_model_preset("tiny")->config;
  EXPECT_EQ(gguf_qk_permute_heads(qwen, "model.layers.0.self_attn.q_proj.weight"), 0);
}

TEST(GgufNamesTest, QuantizeQ8_0LikeGgml) {
  float x[32];
  for (int i = 0; i < 32; ++i)
    x[i] = (i - 10) * 0.25f;
  Q8Block b;
  quantize_q8_0(x, 32, &b);
  const float scale = f16_to_float(b.scale_f16);
  EXPECT_NEAR(scale, 21 * 0.25f / 127, 1e-4);
  EXPECT_EQ(b.quants[31], 127);
  EXPECT_EQ(b.quants[10], 0);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(b.quants[i] * scale, x[i], scale * 0.5f + 1e-3f);
  float zeros[32] = {};
  quantize_q8_0(zeros, 32, &b);
  EXPECT_EQ(b.scale_f16, 0);
}

class GgufRoundTrip : public GgufTest,
                      public ::testing::WithParamInterface<std::tuple<std::string, DType>> {};

TEST_P(GgufRoundTrip, TensorsAndConfigSurvive) {
  const auto& [preset, dtype] = GetParam();
  ModelConfig config = write_source(preset, "m.safetensors");
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  ASSERT_TRUE(
      write_gguf(path("m.gguf"), config, **source, dtype, kTinyTokenizer, "test-model").is_ok());

  auto gguf = GgufFile::open(path("m.gguf"));
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ((*gguf)->version(), 3u);
  EXPECT_EQ(*(*gguf)->get_string("general.name"), "test-model");
  EXPECT_EQ(*(*gguf)->get_string("tokenizer.ggml.model"), "gpt2");

  Result<ModelConfig> from_gguf = (*gguf)->model_config();
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  EXPECT_EQ(*from_gguf, config);
  EXPECT_EQ((*gguf)->names(), (*source)->names());

  for (const std::string& name : (*source)->names()) {
    TensorView want = *(*source)->get(name);
    Result<TensorView> got = (*gguf)->get(name);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->shape, want.shape) << name;
    const DType expected_dtype = want.shape.size() == 1 ? DType::kF32 : dtype;
    ASSERT_EQ(got->dtype, expected_dtype) << name;
    std::vector<float> a = tensor_to_float(want);
    std::vector<float> b = tensor_to_float(*got);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      float expected = a[i];
      if (expected_dtype == DType::kF16)
        expected = f16_to_float(float_to_f16(a[i]));
      if (expected_dtype == DType::kBF16)
        expected = bf16_to_float(float_to_bf16(a[i]));
      if (expected_dtype == DType::kQ8_0) {
        float amax = 0;
        const size_t block = i / 32 * 32;
        for (size_t k = block; k < block + 32; ++k)
          amax = std::max(amax, std::fabs(a[k]));
        // Half a quantisation step, plus the F16 rounding of the scale times |q| <= 127.
        const float step = amax / 127;
        ASSERT_NEAR(b[i], a[i], step * (0.5f + 127.0f / 2048.0f) + 1e-7f)
            << name << "[" << i << "]";
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(expected))
            << name << "[" << i << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GgufRoundTrip,
                         ::testing::Combine(::testing::Values("tiny", "tiny-qwen2", "tiny-llama"),
                                            ::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16, DType::kQ8_0)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" +
                                              std::string(dtype_name(std::get<1>(info.param)));
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch)))
                               ch = '_';
                           }
                           return name;
                         });

TEST_F(GgufTest, LlamaQkRowsArePermutedOnDisk) {
  ModelConfig config = write_source("tiny-llama", "m.safetensors");
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(source.is_ok());
  ASSERT_TRUE(
      write_gguf(path("m.gguf"), config, **source, DType::kF32, kTinyTokenizer, "x").is_ok());
  auto gguf = GgufFile::open(path("m.gguf"));
  ASSERT_TRUE(gguf.is_ok());
  const GgufTensorInfo* info = nullptr;
  for (const auto& t : (*gguf)->tensor_infos()) {
    if (t.name == "blk.0.attn_q.weight")
      info = &t;
  }
  ASSERT_NE(info, nullptr);
  TensorView hf = *(*source)->get("model.layers.0.self_attn.q_proj.weight");
  const int64_t rows = hf.shape[0], cols = hf.shape[1];
  std::vector<float> raw(static_cast<size_t>(rows * cols));
  std::ifstream in(path("m.gguf"), std::ios::binary);
  in.seekg(info->offset);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 4));
  const auto* want = static_cast<const float*>(hf.data);
  for (int64_t g = 0; g < rows; ++g) {
    const int64_t h = llama_qk_hf_row(g, rows, config.num_attention_heads);
    ASSERT_EQ(std::memcmp(&raw[g * cols], &want[h * cols], cols * 4), 0) << g;
  }
  // Row 1 of a llama.cpp head is HF row head_dim/2: the layout really differs.
  EXPECT_NE(std::memcmp(&raw[1 * cols], &want[1 * cols], cols * 4), 0);
  // llama3 scaling also travels as llama.cpp's rope_freqs tensor.
  bool has_rope_freqs = false;
  for (const auto& t : (*gguf)->tensor_infos())
    has_rope_freqs |= t.name == "rope_freqs.weight";
  EXPECT_TRUE(has_rope_freqs);
}

TEST_F(GgufTest, ConcurrentGetsOfPermutedTensorsAgree) {
  ModelConfig config = write_source("tiny-llama", "m.safetensors");
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(source.is_ok());
  ASSERT_TRUE(
      write_gguf(path("m.gguf"), config, **source, DType::kBF16, kTinyTokenizer, "x").is_ok());
  auto gguf = GgufFile::open(path("m.gguf"));
  ASSERT_TRUE(gguf.is_ok());
  const std::vector<std::string> names = (*gguf)->names();
  std::vector<std::vector<const void*>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (const auto& name : names)
        seen[t].push_back((*gguf)->get(name)->data);
    });
  }
  for (auto& th : threads)
    th.join();
  for (int t = 1; t < 4; ++t)
    EXPECT_EQ(seen[t], seen[0]);  // one un-permuted copy per tensor
}

TEST_F(GgufTest, Llama3ScalingRecoveredFromLlamaCppRopeFreqs) {
  // llama.cpp writes no scaling keys for llama3, only rope_freqs.weight.
  ModelConfig truth = find_model_preset("tiny-llama")->config;
  truth.vocab_size = 512;
  truth.bos_token_id = 500;
  truth.eos_token_ids = {500};
  ModelConfig without_keys = truth;
  without_keys.rope_scaling = {};
  for (double factor : {32.0, 8.0}) {
    ModelConfig table = truth;
    table.rope_scaling.factor = factor;
    table.rope_scaling.high_freq_factor = factor == 32.0 ? 4.0 : 2.0;
    std::vector<float> factors = llama3_rope_freq_factors(table);
    GgufWriter w(path("l.gguf"));
    add_gguf_model_metadata(w, without_keys, "x");
    ASSERT_TRUE(w.add_tensor("token_embd.weight", DType::kF32, {512, 64}).is_ok());
    ASSERT_TRUE(
        w.add_tensor("rope_freqs.weight", DType::kF32, {static_cast<int64_t>(factors.size())})
            .is_ok());
    ASSERT_TRUE(w.write_header().is_ok());
    std::vector<float> zeros(512 * 64, 0.0f);
    ASSERT_TRUE(w.write_data(zeros.data(), static_cast<int64_t>(zeros.size() * 4)).is_ok());
    ASSERT_TRUE(w.write_data(factors.data(), static_cast<int64_t>(factors.size() * 4)).is_ok());
    ASSERT_TRUE(w.finish().is_ok());
    auto gguf = GgufFile::open(path("l.gguf"));
    ASSERT_TRUE(gguf.is_ok());
    Result<ModelConfig> c = (*gguf)->model_config();
    if (factor == 32.0) {
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      EXPECT_EQ(c->rope_scaling, truth.rope_scaling);
      EXPECT_TRUE(c->tie_word_embeddings);
    } else {
      // high_freq_factor 2 is not Llama 3.1/3.2's: refused rather than guessed.
      ASSERT_FALSE(c.is_ok());
      EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
    }
  }
}

TEST_F(GgufTest, TokenizerMetadata) {
  ModelConfig config = write_source("tiny", "m.safetensors");
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(
      write_gguf(path("m.gguf"), config, **source, DType::kBF16, kTinyTokenizer, "x").is_ok());
  auto gguf = GgufFile::open(path("m.gguf"));
  ASSERT_TRUE(gguf.is_ok());
  auto tokens = (*gguf)->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[2], "ab");
  EXPECT_EQ((*tokens)[3], "\xc4\xa0");
  EXPECT_EQ((*tokens)[500], "<|end|>");
  EXPECT_EQ((*tokens)[10], "[PAD10]");
  auto types = (*gguf)->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.is_ok());
  EXPECT_EQ((*types)[0], 1);
  EXPECT_EQ((*types)[500], 3);
  EXPECT_EQ((*types)[501], 4);
  EXPECT_EQ((*types)[10], 5);
  auto merges = (*gguf)->get_string_array("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.is_ok());
  EXPECT_EQ(*merges, (std::vector<std::string>{"a b", "\xc4\xa0 a"}));
  EXPECT_EQ(*(*gguf)->get_int("tokenizer.ggml.bos_token_id"), 500);
  EXPECT_EQ(*(*gguf)->get_int("tokenizer.ggml.eos_token_id"), 500);
}

TEST_F(GgufTest, OnlyByteLevelTokenizersAreWritten) {
  ModelConfig config = find_model_preset("tiny")->config;
  config.vocab_size = 512;
  // Llama-2 / Mistral style: Metaspace and byte fallback are not tokenizer.ggml.model "gpt2".
  constexpr const char* kSentencePieceBpe = R"({
    "model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 1, "ab": 2},
              "merges": ["a b"]},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"},
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})";
  GgufWriter w(path("sp.gguf"));
  Status s = add_gguf_tokenizer_metadata(w, kSentencePieceBpe, config);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("byte-level"), std::string::npos) << s.message();
  GgufWriter w2(path("bl.gguf"));
  EXPECT_TRUE(add_gguf_tokenizer_metadata(w2, kTinyTokenizer, config).is_ok());
}

TEST_F(GgufTest, UnsupportedTensorTypeNamesTensorAndType) {
  GgufWriter w(path("q4.gguf"));
  w.set_string("general.architecture", "qwen3");
  // Q8_1 (ggml type 9, an activation type that files do not use): 32 values in 36 bytes.
  ASSERT_TRUE(w.add_tensor_raw("token_embd.weight", 9, {4, 64}, 4 * 2 * 36).is_ok());
  ASSERT_TRUE(w.add_tensor("output_norm.weight", DType::kF32, {64}).is_ok());
  ASSERT_TRUE(w.write_header().is_ok());
  std::vector<uint8_t> zeros(4 * 2 * 36 + 64 * 4, 0);
  ASSERT_TRUE(w.write_data(zeros.data(), static_cast<int64_t>(zeros.size())).is_ok());
  ASSERT_TRUE(w.finish().is_ok());

  auto gguf = GgufFile::open(path("q4.gguf"));
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  Result<TensorView> v = (*gguf)->get("model.embed_tokens.weight");
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(v.status().message().find("token_embd.weight"), std::string::npos);
  EXPECT_NE(v.status().message().find("Q8_1"), std::string::npos) << v.status().message();
  EXPECT_TRUE((*gguf)->get("model.norm.weight").is_ok());
}

// llama-quantize's IQ4_NL file type: attn_v in Q5_K (Llama-3.2-1B: 32 heads over 8 KV heads),
// ffn_down of layers 0-1 (of 16) in Q5_K, the output Q6_K, the rest IQ4_NL.
TEST(GgufTypesTest, Iq4NlFileTypeFollowsLlamaQuantize) {
  ModelConfig c = find_model_preset("llama-3.2-1b")->config;
  const GgufWeightType iq4 = *parse_gguf_weight_type("iq4_nl");
  EXPECT_EQ(gguf_file_type(iq4), 25u);
  auto type = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return gguf_tensor_dtype(iq4, c, name, shape);
  };
  EXPECT_EQ(type("model.embed_tokens.weight", {128256, 2048}), DType::kQ6_K);
  for (int l = 0; l < 16; ++l) {
    const std::string layer = "model.layers." + std::to_string(l);
    EXPECT_EQ(type(layer + ".self_attn.v_proj.weight", {512, 2048}), DType::kQ5_K) << l;
    EXPECT_EQ(type(layer + ".self_attn.q_proj.weight", {2048, 2048}), DType::kIQ4_NL) << l;
    EXPECT_EQ(type(layer + ".mlp.down_proj.weight", {2048, 8192}),
              l < 2 ? DType::kQ5_K : DType::kIQ4_NL)
        << l;
  }
  c.num_key_value_heads = c.num_attention_heads / 2;  // 2 heads per KV head: no bump
  EXPECT_EQ(type("model.layers.3.self_attn.v_proj.weight", {1024, 2048}), DType::kIQ4_NL);
  EXPECT_EQ(type("model.layers.0.self_attn.v_proj.weight", {1024, 96}), DType::kIQ4_NL);
  EXPECT_EQ(type("model.layers.0.mlp.down_proj.weight", {2048, 96}), DType::kQ5_1);  // fallback
}

// llama-quantize's choices per tensor, on a model whose rows are whole 256-value blocks.
TEST(GgufTypesTest, TensorTypesFollowLlamaQuantize) {
  ModelConfig c = find_model_preset("llama-3.2-1b")->config;  // 16 layers, tied, 2048 / 8192
  const GgufWeightType q4km = *parse_gguf_weight_type("q4_k_m");
  EXPECT_EQ(gguf_file_type(q4km), 15u);
  EXPECT_EQ(gguf_file_type(*parse_gguf_weight_type("q5_k_m")), 17u);
  EXPECT_EQ(gguf_file_type(*parse_gguf_weight_type("q6_k")), 18u);
  EXPECT_EQ(gguf_file_type(*parse_gguf_weight_type("q4_0")), 2u);
  EXPECT_EQ(gguf_weight_type_name(q4km), "q4_k_m");
  EXPECT_FALSE(parse_gguf_weight_type("iq4_xs").is_ok());
  const std::vector<int64_t> square = {2048, 2048};
  const std::vector<int64_t> kv = {512, 2048};
  const std::vector<int64_t> down = {2048, 8192};
  auto type = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return gguf_tensor_dtype(q4km, c, name, shape);
  };
  EXPECT_EQ(type("model.embed_tokens.weight", {128256, 2048}), DType::kQ6_K);  // tied output
  EXPECT_EQ(type("model.norm.weight", {2048}), DType::kF32);
  EXPECT_EQ(type("model.layers.5.self_attn.q_proj.weight", square), DType::kQ4_K);
  // use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2.
  for (int l = 0; l < 16; ++l) {
    const bool more = l < 2 || l >= 14 || (l - 2) % 3 == 2;
    const std::string layer = "model.layers." + std::to_string(l);
    EXPECT_EQ(type(layer + ".self_attn.v_proj.weight", kv), more ? DType::kQ6_K : DType::kQ4_K)
        << l;
    EXPECT_EQ(type(layer + ".mlp.down_proj.weight", down), more ? DType::kQ6_K : DType::kQ4_K) << l;
    EXPECT_EQ(type(layer + ".mlp.up_proj.weight", {8192, 2048}), DType::kQ4_K) << l;
  }
  // Rows that are not whole super-blocks fall back like llama-quantize.
  EXPECT_EQ(type("model.layers.5.self_attn.q_proj.weight", {64, 64}), DType::kQ5_0);
  EXPECT_EQ(type("model.embed_tokens.weight", {100, 64}), DType::kQ8_0);
  EXPECT_EQ(gguf_tensor_dtype(*parse_gguf_weight_type("q5_k"), c, "x.weight", {8, 96}),
            DType::kQ5_1);
  for (const char* low_bits : {"q2_k", "q3_k"}) {
    EXPECT_EQ(gguf_tensor_dtype(*parse_gguf_weight_type(low_bits), c, "x.weight", {8, 96}),
              DType::kIQ4_NL)
        << low_bits;
  }
  EXPECT_EQ(gguf_tensor_dtype(*parse_gguf_weight_type("q8_0"), c, "model.embed_tokens.weight",
                              {128256, 2048}),
            DType::kQ8_0);
}

class GgufQuantRoundTrip : public GgufTest, public ::testing::WithParamInterface<std::string> {};

// Every tensor is stored in the type gguf_tensor_dtype() picks, with the bits of ggml's reference
// quantiser, and read back without conversion.
TEST_P(GgufQuantRoundTrip, TensorsKeepTheirTypesAndBits) {
  const GgufWeightType type = *parse_gguf_weight_type(GetParam());
  ModelConfig config = write_source("small", "m.safetensors");  // hidden 256, FFN 768
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(source.is_ok());
  ASSERT_TRUE(write_gguf(path("m.gguf"), config, **source, type, kTinyTokenizer, "q").is_ok());
  auto gguf = GgufFile::open(path("m.gguf"));
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  std::map<std::string, uint32_t> ggml_types;
  for (const GgufTensorInfo& t : (*gguf)->tensor_infos())
    ggml_types[t.name] = t.ggml_type;
  std::set<DType> seen;
  for (const std::string& name : (*source)->names()) {
    const TensorView want = *(*source)->get(name);
    Result<TensorView> got = (*gguf)->get(name);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    const DType expected = gguf_tensor_dtype(type, config, name, want.shape);
    ASSERT_EQ(got->dtype, expected) << name;
    EXPECT_EQ(ggml_types[*hf_to_gguf_name(name)], ggml_type_of(expected)) << name;
    seen.insert(expected);
    const int64_t n = want.num_elements();
    std::vector<uint8_t> q(dtype_num_bytes(expected, n));
    float_to_dtype(static_cast<const float*>(want.data), n, expected, q.data());
    ASSERT_EQ(got->num_bytes, static_cast<int64_t>(q.size())) << name;
    EXPECT_EQ(std::memcmp(got->data, q.data(), q.size()), 0) << name;
  }
  if (type.dtype == DType::kQ4_K) {  // the mix really mixes
    EXPECT_TRUE(seen.count(DType::kQ4_K) && seen.count(DType::kQ6_K));
  } else {
    EXPECT_TRUE(seen.count(type.dtype)) << gguf_weight_type_name(type);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgufQuantRoundTrip,
                         ::testing::Values("q4_k_m", "q5_k_m", "q4_k", "q6_k", "q3_k", "q2_k",
                                           "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"));

TEST_F(GgufTest, TruncatedFileIsDataLoss) {
  ModelConfig config = write_source("tiny", "m.safetensors");
  auto source = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(
      write_gguf(path("m.gguf"), config, **source, DType::kF16, kTinyTokenizer, "x").is_ok());
  const auto size = fs::file_size(path("m.gguf"));
  // Cut in the tensor data, in the tensor infos / metadata, and right after the magic.
  for (uint64_t keep : {size - 100, size / 2 > 20000 ? uint64_t{20000} : size / 2, uint64_t{6}}) {
    fs::copy_file(path("m.gguf"), path("cut.gguf"), fs::copy_options::overwrite_existing);
    fs::resize_file(path("cut.gguf"), keep);
    auto gguf = GgufFile::open(path("cut.gguf"));
    ASSERT_FALSE(gguf.is_ok()) << keep;
    EXPECT_EQ(gguf.status().code(), StatusCode::kDataLoss) << gguf.status().to_string();
    EXPECT_NE(gguf.status().message().find("cut.gguf"), std::string::npos);
  }
  fs::copy_file(path("m.gguf"), path("cut.gguf"), fs::copy_options::overwrite_existing);
  fs::resize_file(path("cut.gguf"), size - 100);
  auto gguf = GgufFile::open(path("cut.gguf"));
  EXPECT_NE(gguf.status().message().find("truncated"), std::string::npos);
}

TEST_F(GgufTest, CorruptHeaderValuesAreRejected) {
  GgufWriter w(path("bad.gguf"));
  w.set_string("general.architecture", "qwen3");
  ASSERT_TRUE(w.add_tensor("token_embd.weight", DType::kF32, {2, 32}).is_ok());
  ASSERT_TRUE(w.write_header().is_ok());
  std::vector<float> zeros(64, 0.0f);
  ASSERT_TRUE(w.write_data(zeros.data(), 256).is_ok());
  ASSERT_TRUE(w.finish().is_ok());
  std::string bytes;
  {
    std::ifstream in(path("bad.gguf"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write_variant = [&](const std::string& b) {
    std::ofstream(path("v.gguf"), std::ios::binary) << b;
    return GgufFile::open(path("v.gguf")).status();
  };
  std::string huge_count = bytes;
  uint64_t count = uint64_t{1} << 60;
  std::memcpy(&huge_count[8], &count, 8);  // tensor count
  EXPECT_EQ(write_variant(huge_count).code(), StatusCode::kDataLoss);
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_EQ(write_variant(bad_magic).code(), StatusCode::kDataLoss);
  std::string long_key = bytes;
  uint64_t key_len = uint64_t{1} << 40;
  std::memcpy(&long_key[24], &key_len, 8);  // length of the first key
  EXPECT_EQ(write_variant(long_key).code(), StatusCode::kDataLoss);
  // The model config needs qwen3.* keys this file lacks: a clear error, not a crash.
  auto gguf = GgufFile::open(path("bad.gguf"));
  ASSERT_TRUE(gguf.is_ok());
  Result<ModelConfig> c = (*gguf)->model_config();
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("qwen3.embedding_length"), std::string::npos);
}

TEST_F(GgufTest, Qwen2VlLanguageModelRoundTrips) {
  // A vocabulary that holds the vision tokens at ids of its own.
  constexpr const char* kVlTokenizer = R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
    "added_tokens": [{"id": 500, "content": "<|end|>", "special": true},
                     {"id": 502, "content": "<|vision_start|>", "special": true},
                     {"id": 503, "content": "<|vision_end|>", "special": true},
                     {"id": 504, "content": "<|image_pad|>", "special": true}],
    "decoder": {"type": "ByteLevel"}})";
  for (const char* preset : {"tiny-qwen2-vl", "tiny-qwen2.5-vl"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = write_source(preset, "vl.safetensors");
    c.image_token_id = 504;
    c.vision_start_token_id = 502;
    c.vision_end_token_id = 503;
    auto source = SafetensorsFile::open(path("vl.safetensors"));
    ASSERT_TRUE(source.is_ok());
    ASSERT_TRUE(write_gguf(path("vl.gguf"), c, **source, DType::kF32, kVlTokenizer, "vl").is_ok());
    auto f = GgufFile::open(path("vl.gguf"));
    ASSERT_TRUE(f.is_ok());
    EXPECT_EQ((*f)->get_string("general.architecture").value(), "qwen2vl");
    EXPECT_EQ((*f)->get_int("qwen2vl.block_count").value(), 2);
    EXPECT_EQ((*f)->get_int_array("qwen2vl.rope.dimension_sections").value(),
              (std::vector<int64_t>{2, 3, 3, 0}));
    // The tower stays out of the LLM file; the LLM keeps its HF names.
    for (const GgufTensorInfo& t : (*f)->tensor_infos())
      EXPECT_EQ(t.name.find("visual"), std::string::npos) << t.name;
    EXPECT_TRUE((*f)->get("model.layers.1.self_attn.k_proj.bias").is_ok());
    Result<ModelConfig> read = (*f)->model_config();
    ASSERT_TRUE(read.is_ok()) << read.status().to_string();
    ModelConfig expected = c;
    expected.vision.reset();  // in the mmproj
    EXPECT_EQ(*read, expected);
  }
  // Without the tokens in the vocabulary the ids default to Qwen's, which a 512-token
  // vocabulary cannot hold.
  ModelConfig c = write_source("tiny-qwen2-vl", "vl.safetensors");
  auto source = SafetensorsFile::open(path("vl.safetensors"));
  ASSERT_TRUE(
      write_gguf(path("plain.gguf"), c, **source, DType::kF32, kTinyTokenizer, "p").is_ok());
  Result<ModelConfig> read = (*GgufFile::open(path("plain.gguf")))->model_config();
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("151655"), std::string::npos);
}

}  // namespace
}  // namespace crescent::model
