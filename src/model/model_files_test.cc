#include "model/model_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/make_model.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("model_files_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    MakeModelOptions o;
    o.preset = "tiny";
    o.out_dir = (dir_ / "tiny").string();
    ASSERT_TRUE(make_model(o).is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ModelFilesTest, DirectoryWithOnlyAGgufOpensIt) {
  fs::create_directories(dir_ / "g");
  for (const char* f : {"model.gguf", "tokenizer.json"})
    fs::copy(dir_ / "tiny" / f, dir_ / "g" / f);
  Result<ModelFiles> m = open_model((dir_ / "g").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->config.architecture, Architecture::kQwen3);
  EXPECT_TRUE(m->tokenizer_config_path.empty());
  EXPECT_TRUE(m->tensors->get("model.embed_tokens.weight").is_ok());
}

TEST_F(ModelFilesTest, ShardedCheckpointOpens) {
  fs::create_directories(dir_ / "s");
  for (const char* f : {"config.json", "tokenizer.json"})
    fs::copy(dir_ / "tiny" / f, dir_ / "s" / f);
  fs::copy(dir_ / "tiny" / "model.safetensors", dir_ / "s" / "model-00001-of-00001.safetensors");
  std::ofstream(dir_ / "s" / "model.safetensors.index.json")
      << R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}})";
  Result<ModelFiles> m = open_model((dir_ / "s").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->tensors->names(), std::vector<std::string>{"model.embed_tokens.weight"});
}

TEST_F(ModelFilesTest, ClearErrors) {
  fs::remove(dir_ / "tiny" / "tokenizer.json");
  Result<ModelFiles> m = open_model((dir_ / "tiny").string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("tokenizer.json"), std::string::npos);
  // The GGUF carries its own tokenizer: it opens without tokenizer.json.
  m = open_model((dir_ / "tiny" / "model.gguf").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->tokenizer_gguf_path, (dir_ / "tiny" / "model.gguf").string());

  std::ofstream(dir_ / "tiny" / "config.json")
      << R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10})";
  m = open_model((dir_ / "tiny").string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("GPT2LMHeadModel"), std::string::npos);

  EXPECT_EQ(open_model((dir_ / "missing").string()).status().code(), StatusCode::kNotFound);
  fs::create_directories(dir_ / "empty");
  m = open_model((dir_ / "empty").string());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos);
}

TEST_F(ModelFilesTest, VisionLanguageGgufFindsItsMmproj) {
  MakeModelOptions o;
  o.preset = "tiny-qwen2.5-vl";
  o.out_dir = (dir_ / "vl").string();
  ASSERT_TRUE(make_model(o).is_ok());

  // A directory holding only the GGUF pair (and the tokenizer) opens model.gguf with its tower.
  fs::create_directories(dir_ / "pair");
  for (const char* f : {"model.gguf", "mmproj.gguf", "tokenizer.json"})
    fs::copy(dir_ / "vl" / f, dir_ / "pair" / f);
  Result<ModelFiles> m = open_model((dir_ / "pair").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->config.architecture, Architecture::kQwen25Vl);
  ASSERT_TRUE(m->config.vision.has_value());
  EXPECT_EQ(m->config.vision->fullatt_block_indexes, (std::vector<int>{1, 3}));
  EXPECT_TRUE(m->vision_tensors->get("visual.blocks.3.mlp.gate_proj.weight").is_ok());
  EXPECT_TRUE(m->preprocessor_config_path.empty());

  // No mmproj beside it: NotFound saying what is missing; an explicit path works.
  fs::rename(dir_ / "pair" / "mmproj.gguf", dir_ / "elsewhere.gguf");
  m = open_model((dir_ / "pair" / "model.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("mmproj"), std::string::npos);
  m = open_model((dir_ / "pair" / "model.gguf").string(), (dir_ / "elsewhere.gguf").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->config.vision->window_size, 56);

  // Two candidates: the caller must choose.
  fs::copy(dir_ / "elsewhere.gguf", dir_ / "pair" / "mmproj-a.gguf");
  fs::copy(dir_ / "elsewhere.gguf", dir_ / "pair" / "mmproj-b.gguf");
  m = open_model((dir_ / "pair" / "model.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("several mmproj"), std::string::npos);

  // An mmproj does not go with a text model, nor with an HF checkout (it has its own tower).
  m = open_model((dir_ / "tiny" / "model.gguf").string(), (dir_ / "elsewhere.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("text-only"), std::string::npos);
  m = open_model((dir_ / "tiny").string(), (dir_ / "elsewhere.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  m = open_model((dir_ / "vl").string(), (dir_ / "elsewhere.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("own vision tower"), std::string::npos);
  m = open_model((dir_ / "vl" / "model.gguf").string(), (dir_ / "missing.gguf").string());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);

  // A text model has no tower; a vision-language checkout without visual.* tensors is refused.
  m = open_model((dir_ / "tiny").string());
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->vision_tensors, nullptr);
  EXPECT_FALSE(m->config.vision.has_value());
  fs::create_directories(dir_ / "no_tower");
  for (const char* f : {"config.json", "tokenizer.json"})
    fs::copy(dir_ / "vl" / f, dir_ / "no_tower" / f);
  fs::copy(dir_ / "tiny" / "model.safetensors", dir_ / "no_tower" / "model.safetensors");
  m = open_model((dir_ / "no_tower").string());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("visual.patch_embed.proj.weight"), std::string::npos);
}

}  // namespace
}  // namespace crescent::model
