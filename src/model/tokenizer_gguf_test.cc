#include "model/tokenizer_gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/model_files.h"
#include "model/unicode.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

// Texts whose ids must not depend on where the tokenizer came from: every split-regex branch,
// NFC (Qwen2), added and special tokens, byte-level fallback for rare characters.
const std::vector<std::string> kTexts = {
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's what we've done, isn't it? YOU'RE RIGHT",
    "naïve café façade Ünïcödé",
    "e\xcc\x81 vs \xc3\xa9 (decomposed and composed)",
    "中文测试：你好，世界！日本語のテキスト、한국어 텍스트",
    "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧‍👦 end",
    "digits 1234567890 3.14159 1,000,000 and 42nd",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\nand\r\nCRLF \n \n",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<think>reasoning</think> answer",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "",
    " ",
    "\xef\xbf\xbd replacement char and \xe2\x80\x8b zero width",
};

class TokenizerGgufTest : public ::testing::TestWithParam<std::string> {
 protected:
  static fs::path root() {
    return fs::path(::testing::TempDir()) / ("tokenizer_gguf_test_" + std::to_string(::getpid()));
  }
  static void TearDownTestSuite() { fs::remove_all(root()); }

  // A made model (safetensors + tokenizer.json + model.gguf), once per preset.
  static fs::path made(const std::string& preset) {
    const fs::path dir = root() / preset;
    if (!fs::exists(dir / "model.gguf")) {
      MakeModelOptions o;
      o.preset = preset;
      o.out_dir = dir.string();
      Status s = make_model(o);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    }
    return dir;
  }
};

TEST_P(TokenizerGgufTest, SameIdsAndTextAsTokenizerJson) {
  const fs::path dir = made(GetParam());
  auto json_tok = Tokenizer::from_file((dir / "tokenizer.json").string());
  ASSERT_TRUE(json_tok.is_ok()) << json_tok.status().to_string();
  auto gguf = GgufFile::open((dir / "model.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  auto from_gguf = tokenizer_from_gguf(**gguf);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  const Tokenizer& a = **json_tok;
  const Tokenizer& b = *from_gguf->tokenizer;

  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  for (int32_t id = 0; id < a.vocab_size(); ++id) {
    ASSERT_EQ(a.id_to_token(id), b.id_to_token(id)) << id;
    ASSERT_EQ(a.is_special(id), b.is_special(id)) << id << " " << a.id_to_token(id);
  }
  for (const std::string& text : kTexts) {
    for (bool add_special : {true, false}) {
      auto ids_a = a.encode(text, add_special);
      auto ids_b = b.encode(text, add_special);
      ASSERT_TRUE(ids_a.is_ok() && ids_b.is_ok()) << text;
      EXPECT_EQ(*ids_a, *ids_b) << "'" << text << "' add_special=" << add_special;
      for (bool skip : {false, true}) {
        EXPECT_EQ(a.decode(*ids_a, skip), b.decode(*ids_b, skip)) << text;
      }
    }
  }
  // The engine streams output through StreamingDetokenizer: same pieces from both.
  auto ids = a.encode(kTexts[6], false);
  ASSERT_TRUE(ids.is_ok());
  StreamingDetokenizer sa(a, false), sb(b, false);
  for (int32_t id : *ids)
    EXPECT_EQ(sa.push(id), sb.push(id));
  EXPECT_EQ(sa.flush(), sb.flush());
}

TEST_P(TokenizerGgufTest, ChatTemplateAndSpecialTokensTravelInTheFile) {
  const fs::path dir = made(GetParam());
  auto config = TokenizerConfig::from_file((dir / "tokenizer_config.json").string());
  ASSERT_TRUE(config.is_ok());
  auto gguf = GgufFile::open((dir / "model.gguf").string());
  ASSERT_TRUE(gguf.is_ok());
  auto from_gguf = tokenizer_from_gguf(**gguf);
  ASSERT_TRUE(from_gguf.is_ok());
  ASSERT_FALSE(config->chat_template.empty());
  EXPECT_EQ(from_gguf->config.chat_template, config->chat_template);
  if (config->bos_token) {
    EXPECT_EQ(from_gguf->config.bos_token, config->bos_token);
  }
  EXPECT_TRUE(from_gguf->config.eos_token.has_value());
  EXPECT_TRUE(ChatTemplate::from_config(from_gguf->config).is_ok());
}

TEST_P(TokenizerGgufTest, LoneGgufOpensWithItsOwnTokenizer) {
  const fs::path dir = made(GetParam());
  const fs::path lone = root() / (GetParam() + "-lone");
  fs::create_directories(lone);
  fs::copy_file(dir / "model.gguf", lone / "model.gguf", fs::copy_options::overwrite_existing);

  auto files = open_model((lone / "model.gguf").string());
  ASSERT_TRUE(files.is_ok()) << files.status().to_string();
  EXPECT_TRUE(files->tokenizer_json_path.empty());
  EXPECT_EQ(files->tokenizer_gguf_path, (lone / "model.gguf").string());
  EXPECT_EQ(files->directory, lone.string());
  TokenizerConfig config;
  auto tok = open_tokenizer(*files, &config);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_FALSE(config.chat_template.empty());
  for (const std::string& path : {lone.string(), (lone / "model.gguf").string()}) {
    auto by_path = open_tokenizer(path);
    ASSERT_TRUE(by_path.is_ok()) << path << ": " << by_path.status().to_string();
    EXPECT_EQ(*(*by_path)->encode(kTexts[11]), *(*tok)->encode(kTexts[11]));
  }
  // Beside the made model's tokenizer.json, the file wins.
  auto beside = open_model((dir / "model.gguf").string());
  ASSERT_TRUE(beside.is_ok());
  EXPECT_EQ(beside->tokenizer_json_path, (dir / "tokenizer.json").string());
  EXPECT_TRUE(beside->tokenizer_gguf_path.empty());
}

// Llama-3.1's tokenizer.json adds <|begin_of_text|> with a TemplateProcessing post-processor:
// the writer turns that into add_bos_token, and the GGUF tokenizer adds the same BOS.
class TokenizerGgufLlama31Test : public TokenizerGgufTest {};

TEST_F(TokenizerGgufLlama31Test, TemplateProcessingBosRoundTrips) {
  const fs::path dir = made("tiny-llama");
  auto text = read_file((dir / "tokenizer.json").string());
  ASSERT_TRUE(text.is_ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|begin_of_text|>",
         {{"id", "<|begin_of_text|>"}, {"ids", {128000}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  auto hf = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();

  const std::string path = (root() / "llama31.gguf").string();
  GgufWriter w(path);
  const ModelConfig config = *parse_model_config(*read_file((dir / "config.json").string()));
  ASSERT_TRUE(add_gguf_tokenizer_metadata(w, j.dump(), config).is_ok());
  ASSERT_TRUE(w.finish().is_ok());
  auto gguf = GgufFile::open(path);
  ASSERT_TRUE(gguf.is_ok());
  EXPECT_TRUE(*(*gguf)->get_bool("tokenizer.ggml.add_bos_token"));
  auto t = tokenizer_from_gguf(**gguf);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  for (const std::string& s : kTexts) {
    EXPECT_EQ(*t.value().tokenizer->encode(s), *(*hf)->encode(s)) << s;
  }
  EXPECT_EQ(t.value().tokenizer->encode("hi")->front(), 128000);
}

INSTANTIATE_TEST_SUITE_P(Presets, TokenizerGgufTest, ::testing::Values("tiny", "tiny-llama"));

// Hand-written GGUF tokenizers: the GPT-2 pre-tokenizer, BOS handling and the errors.
class GgufTokenizerKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("gguf_tokenizer_keys_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    // Byte-level vocabulary: the 256 byte characters, then merges "Ġ t", "h e", "Ġt he".
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      std::string s;
      unicode::append_utf8(printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++),
                           &s);
      tokens_.push_back(s);
    }
    for (const char* t : {"\xc4\xa0t", "he", "\xc4\xa0the"})
      tokens_.push_back(t);
    merges_ = {"\xc4\xa0 t", "h e", "\xc4\xa0t he"};
    tokens_.push_back("<|end|>");
    types_.assign(tokens_.size(), 1);
    types_.back() = 3;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& model, const std::string& pre, int add_bos = -1) {
    const std::string p = (dir_ / ("t" + std::to_string(num_files_++) + ".gguf")).string();
    GgufWriter w(p);
    w.set_string("general.architecture", "qwen2");
    w.set_string("tokenizer.ggml.model", model);
    if (!pre.empty())
      w.set_string("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", tokens_);
    w.set_i32_array("tokenizer.ggml.token_type", types_);
    w.set_string_array("tokenizer.ggml.merges", merges_);
    w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens_.size() - 1));
    if (add_bos >= 0)
      w.set_bool("tokenizer.ggml.add_bos_token", add_bos == 1);
    EXPECT_TRUE(w.finish().is_ok());
    return p;
  }
  Result<GgufTokenizer> load(const std::string& p) {
    ASSIGN_OR_RETURN(auto gguf, GgufFile::open(p));
    return tokenizer_from_gguf(*gguf);
  }

  fs::path dir_;
  int num_files_ = 0;
  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::vector<std::string> merges_;
};

TEST_F(GgufTokenizerKeysTest, Gpt2PreTokenizerMatchesTokenizerJson) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i + 1 < tokens_.size(); ++i)
    vocab[tokens_[i]] = i;
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges_}}},
      {"added_tokens", {{{"id", tokens_.size() - 1}, {"content", "<|end|>"}, {"special", true}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  auto hf = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  for (const std::string pre : {"gpt2", "gpt-2", "default", ""}) {
    auto t = load(write("gpt2", pre));
    ASSERT_TRUE(t.is_ok()) << pre << ": " << t.status().to_string();
    for (const std::string& text : kTexts) {
      EXPECT_EQ(*t->tokenizer->encode(text), *(*hf)->encode(text)) << pre << ": " << text;
    }
    EXPECT_EQ(*t->tokenizer->encode(" the"), (std::vector<int32_t>{258}));
  }
}

TEST_F(GgufTokenizerKeysTest, AddBosTokenFollowsTheKeyThenTheFamily) {
  const int32_t bos = static_cast<int32_t>(tokens_.size() - 1);
  auto with = load(write("gpt2", "qwen2", 1));
  ASSERT_TRUE(with.is_ok()) << with.status().to_string();
  EXPECT_EQ(*with->tokenizer->encode("he"), (std::vector<int32_t>{bos, 257}));
  EXPECT_EQ(*with->tokenizer->encode("he", false), (std::vector<int32_t>{257}));
  EXPECT_EQ(with->config.bos_token, "<|end|>");
  auto without = load(write("gpt2", "llama-bpe", 0));
  ASSERT_TRUE(without.is_ok());
  EXPECT_EQ(*without->tokenizer->encode("he"), (std::vector<int32_t>{257}));
  // Absent: Llama-3 adds BOS (as llama.cpp does), Qwen2 does not.
  EXPECT_EQ(*load(write("gpt2", "llama3"))->tokenizer->encode("he"),
            (std::vector<int32_t>{bos, 257}));
  EXPECT_EQ(*load(write("gpt2", "qwen2"))->tokenizer->encode("he"), (std::vector<int32_t>{257}));
}

TEST_F(GgufTokenizerKeysTest, UnsupportedModelsAndPreTokenizersAreNamed) {
  auto spm = load(write("llama", "default"));
  ASSERT_FALSE(spm.is_ok());
  EXPECT_EQ(spm.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(spm.status().message().find("'llama'"), std::string::npos) << spm.status().message();
  EXPECT_NE(spm.status().message().find("SentencePiece"), std::string::npos);

  auto pre = load(write("gpt2", "deepseek-coder"));
  ASSERT_FALSE(pre.is_ok());
  EXPECT_EQ(pre.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(pre.status().message().find("'deepseek-coder'"), std::string::npos)
      << pre.status().message();

  types_.pop_back();  // token_type shorter than tokens
  auto bad = load(write("gpt2", "qwen2"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("token_type"), std::string::npos);
}

TEST_F(GgufTokenizerKeysTest, GgufWithoutTokenizerNeedsTokenizerJson) {
  const std::string p = (dir_ / "bare.gguf").string();
  GgufWriter w(p);
  w.set_string("general.architecture", "qwen2");
  ASSERT_TRUE(w.finish().is_ok());
  auto gguf = GgufFile::open(p);
  ASSERT_TRUE(gguf.is_ok());
  EXPECT_FALSE(gguf_has_tokenizer(**gguf));
  auto t = tokenizer_from_gguf(**gguf);
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  auto by_path = open_tokenizer(p);
  EXPECT_EQ(by_path.status().code(), StatusCode::kNotFound) << by_path.status().to_string();
  EXPECT_NE(by_path.status().message().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace crescent::model
