#include "core/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace crescent {
namespace {

namespace fs = std::filesystem;

class ReadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("crescent_read_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }

  fs::path dir_;
};

TEST_F(ReadFileTest, ReturnsEveryByte) {
  EXPECT_EQ(*read_file(write("empty", "")), "");
  const std::string small("a\0b\nc", 5);
  EXPECT_EQ(*read_file(write("small", small)), small);
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>(i * 131 + (i >> 12));
  }
  EXPECT_EQ(*read_file(write("big", big)), big);
}

TEST_F(ReadFileTest, FileWithoutALengthIsReadToItsEnd) {
  // /proc files report length 0 and still have content.
  auto status = read_file("/proc/self/status");
  ASSERT_TRUE(status.is_ok()) << status.status().message();
  EXPECT_NE(status->find("Pid:"), std::string::npos);
  EXPECT_GT(status->size(), 100u);
}

TEST_F(ReadFileTest, ErrorsNameThePathAndTheReason) {
  const std::string missing = (dir_ / "missing.json").string();
  auto r = read_file(missing);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
  EXPECT_NE(r.status().message().find("No such file"), std::string::npos);

  auto d = read_file(dir_.string());
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("Is a directory"), std::string::npos);
}

}  // namespace
}  // namespace crescent
