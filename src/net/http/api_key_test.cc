#include "net/http/api_key.h"

#include <gtest/gtest.h>

namespace crescent::net::http {
namespace {

Request request_to(std::string path, std::optional<std::string> authorization) {
  Request r;
  r.method = "POST";
  r.path = path;
  r.target = std::move(path);
  if (authorization) {
    r.headers["authorization"] = *authorization;
  }
  return r;
}

TEST(ApiKeyTest, WithoutAKeyEverythingIsAllowed) {
  ApiKeyCheck open;
  EXPECT_FALSE(open.is_enabled());
  EXPECT_FALSE(open.refusal(request_to("/v1/completions", std::nullopt)));
  EXPECT_FALSE(open.refusal(request_to("/v1/models", "Bearer whatever")));
}

TEST(ApiKeyTest, BadKeysAreRefusedAtStart) {
  EXPECT_FALSE(ApiKeyCheck::make("").is_ok());
  EXPECT_FALSE(ApiKeyCheck::make("two words").is_ok());
  EXPECT_FALSE(ApiKeyCheck::make("line\nbreak").is_ok());
  EXPECT_FALSE(ApiKeyCheck::make("caf\xc3\xa9").is_ok());
  auto message = ApiKeyCheck::make("a key").status().message();
  EXPECT_EQ(message.find("a key"), std::string::npos) << "the key must not be echoed";
  EXPECT_TRUE(ApiKeyCheck::make("sk-abc_123.XYZ~!").is_ok());
}

TEST(ApiKeyTest, OnlyTheRightBearerTokenPasses) {
  auto check = ApiKeyCheck::make("sk-secret-1");
  ASSERT_TRUE(check.is_ok());
  EXPECT_TRUE(check->is_enabled());
  EXPECT_FALSE(check->refusal(request_to("/v1/completions", "Bearer sk-secret-1")));
  // The scheme is case-insensitive (RFC 9110); surrounding blanks are not part of the token.
  EXPECT_FALSE(check->refusal(request_to("/v1/chat/completions", "bearer sk-secret-1")));
  EXPECT_FALSE(check->refusal(request_to("/v1/models", "  BEARER   sk-secret-1 ")));

  struct Case {
    std::optional<std::string> authorization;
    const char* says;
  };
  const Case refused[] = {
      {std::nullopt, "needs an API key"},
      {"", "Bearer scheme"},
      {"sk-secret-1", "Bearer scheme"},
      {"Basic c2stc2VjcmV0LTE=", "Bearer scheme"},
      {"Token sk-secret-1", "Bearer scheme"},
      {"Bearer", "Bearer scheme"},
      {"Bearer ", "Bearer scheme"},
      {"Bearer sk-secret-2", "invalid API key"},
      {"Bearer sk-secret-1x", "invalid API key"},
      {"Bearer sk-secret-", "invalid API key"},
      {"Bearer SK-SECRET-1", "invalid API key"},
      {"Bearer sk-secret-1 sk-secret-1", "invalid API key"},
  };
  for (const Case& c : refused) {
    auto why = check->refusal(request_to("/v1/completions", c.authorization));
    ASSERT_TRUE(why.has_value()) << c.authorization.value_or("(none)");
    EXPECT_NE(why->find(c.says), std::string::npos) << *why;
    EXPECT_EQ(why->find("sk-secret-1"), std::string::npos) << *why;
  }
  // Any path but the open ones needs the key, so a route added later is not open by mistake.
  EXPECT_TRUE(check->refusal(request_to("/v2/unknown", std::nullopt)));
  EXPECT_TRUE(check->refusal(request_to("/", std::nullopt)));
  EXPECT_TRUE(check->refusal(request_to("/health/", std::nullopt)));
  for (const char* open : {"/health", "/metrics", "/version", "/ping"}) {
    EXPECT_FALSE(check->refusal(request_to(open, std::nullopt))) << open;
    EXPECT_FALSE(check->refusal(request_to(open, "Bearer wrong"))) << open;
  }
}

TEST(ApiKeyTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(constant_time_equals("abc", "abc"));
  EXPECT_FALSE(constant_time_equals("abc", "abd"));
  EXPECT_FALSE(constant_time_equals("abc", "ab"));
  EXPECT_FALSE(constant_time_equals("abc", "abcabc"));  // the cyclic read must not match
  EXPECT_FALSE(constant_time_equals("abc", ""));
  EXPECT_FALSE(constant_time_equals("", "a"));
  EXPECT_TRUE(constant_time_equals("", ""));
}

}  // namespace
}  // namespace crescent::net::http
