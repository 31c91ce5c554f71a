#include "net/auth/auth_token.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace crescent::net::auth {
namespace {

std::string hmac_hex(std::string_view key, std::string_view message) {
  return to_hex(as_view(hmac_sha256(key, message)));
}

// RFC 4231 test cases 1, 2, 4 and 6 (HMAC-SHA-256).
TEST(HmacSha256, Rfc4231Vectors) {
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  std::string key4;
  for (int i = 1; i <= 25; ++i)
    key4.push_back(static_cast<char>(i));
  EXPECT_EQ(hmac_hex(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(
      hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Sha256, KnownDigest) {
  EXPECT_EQ(to_hex(as_view(sha256("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(DigestsEqual, LengthAndContent) {
  EXPECT_TRUE(digests_equal("abc", "abc"));
  EXPECT_FALSE(digests_equal("abc", "abd"));
  EXPECT_FALSE(digests_equal("abc", "abcd"));
  EXPECT_NE(random_bytes(32), random_bytes(32));
  EXPECT_EQ(random_bytes(32).size(), 32u);
}

class LoadAuthToken : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "auth_token_" + std::to_string(::getpid());
    ::unsetenv(std::string(kAuthTokenEnv).c_str());
  }
  void TearDown() override {
    std::remove(path_.c_str());
    ::unsetenv(std::string(kAuthTokenEnv).c_str());
  }
  void write(const std::string& text) {
    std::ofstream(path_) << text;
    ::chmod(path_.c_str(), 0600);
  }
  std::string path_;
};

TEST_F(LoadAuthToken, FileWithTrailingNewline) {
  write("0123456789abcdef0123\n");
  auto token = load_auth_token(path_);
  ASSERT_TRUE(token.is_ok()) << token.status().to_string();
  EXPECT_EQ(*token, "0123456789abcdef0123");
}

TEST_F(LoadAuthToken, EmptyFileIsRefused) {
  write("\n");
  auto token = load_auth_token(path_);
  ASSERT_FALSE(token.is_ok());
  EXPECT_NE(token.status().message().find("holds no token"), std::string::npos);
  EXPECT_NE(token.status().message().find("--auth-token-file"), std::string::npos);
}

TEST_F(LoadAuthToken, MissingFileIsRefused) {
  auto token = load_auth_token(path_ + ".missing");
  ASSERT_FALSE(token.is_ok());
  EXPECT_NE(token.status().message().find("cannot read"), std::string::npos);
}

TEST_F(LoadAuthToken, EnvironmentWhenNoFile) {
  auto none = load_auth_token("");
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
  ::setenv(std::string(kAuthTokenEnv).c_str(), "from-env-token-123", 1);
  auto token = load_auth_token("");
  ASSERT_TRUE(token.is_ok());
  EXPECT_EQ(*token, "from-env-token-123");
  // The file wins over the environment.
  write("from-file-token-456");
  EXPECT_EQ(*load_auth_token(path_), "from-file-token-456");
}

}  // namespace
}  // namespace crescent::net::auth
