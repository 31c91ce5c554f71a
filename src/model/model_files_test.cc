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
  m = open_model((dir_ / "tiny" / "model.gguf").string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("tokenizer.json"), std::string::npos);

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

}  // namespace
}  // namespace crescent::model
