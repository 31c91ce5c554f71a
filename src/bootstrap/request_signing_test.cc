// Signed registrations: the signature scheme on its own, then a bootstrap with a token over real
// HTTP on 127.0.0.1 (unsigned, wrongly signed and replayed registrations are 401 JSON errors;
// the client's signed registration and GET /query work).

#include "bootstrap/request_signing.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bootstrap/bootstrap_client.h"
#include "bootstrap/bootstrap_server.h"
#include "core/check.h"
#include "net/http/http_client.h"

namespace crescent::bootstrap {
namespace {

using nlohmann::json;

constexpr int64_t kNow = 1'800'000'000;
const std::string kToken = "bootstrap-token-0123456789";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RequestSigning, SignedRequestVerifiesOnce) {
  RequestVerifier v(kToken);
  const std::string header = sign_request(kToken, "POST", "/register", "{\"a\":1}", kNow);
  EXPECT_TRUE(header.rfind("Crescent-HMAC-SHA256 ts=", 0) == 0) << header;
  EXPECT_FALSE(contains(header, kToken));
  EXPECT_TRUE(v.verify("POST", "/register", "{\"a\":1}", header, kNow + 5).is_ok());
  Status replay = v.verify("POST", "/register", "{\"a\":1}", header, kNow + 6);
  EXPECT_EQ(replay.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(contains(replay.message(), "replayed")) << replay.message();
}

TEST(RequestSigning, AnyChangeBreaksTheSignature) {
  RequestVerifier v(kToken);
  const std::string header = sign_request(kToken, "POST", "/register", "body", kNow);
  EXPECT_FALSE(v.verify("POST", "/register", "body2", header, kNow).is_ok());
  EXPECT_FALSE(v.verify("GET", "/register", "body", header, kNow).is_ok());
  EXPECT_FALSE(v.verify("POST", "/query", "body", header, kNow).is_ok());
  const std::string other =
      sign_request("another-token-000000000", "POST", "/register", "body", kNow);
  Status wrong = v.verify("POST", "/register", "body", other, kNow);
  EXPECT_TRUE(contains(wrong.message(), "wrong Authorization signature")) << wrong.message();
}

TEST(RequestSigning, StaleAndMalformedHeadersAreRefused) {
  RequestVerifier v(kToken);
  Status stale = v.verify("POST", "/register", "",
                          sign_request(kToken, "POST", "/register", "", kNow - 61), kNow);
  EXPECT_TRUE(contains(stale.message(), "stale")) << stale.message();
  Status future = v.verify("POST", "/register", "",
                           sign_request(kToken, "POST", "/register", "", kNow + 61), kNow);
  EXPECT_TRUE(contains(future.message(), "stale")) << future.message();
  EXPECT_TRUE(contains(v.verify("POST", "/register", "", "", kNow).message(), "no Authorization"));
  EXPECT_FALSE(v.verify("POST", "/register", "", "Bearer " + kToken, kNow).is_ok());
  EXPECT_FALSE(
      v.verify("POST", "/register", "", "Crescent-HMAC-SHA256 ts=x,nonce=y,sig=z", kNow).is_ok());
}

class SignedBootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BootstrapServerOptions options;
    options.port = 0;
    options.auth_token = kToken;
    auto server = BootstrapServer::start(options);
    CRESCENT_CHECK(server.is_ok()) << server.status().to_string();
    server_ = std::move(server).value();
    client_ = std::make_unique<net::http::HttpClient>("127.0.0.1", server_->port());
  }
  net::http::Response post(const std::string& body, net::http::Headers headers = {}) {
    auto r = client_->request("POST", "/register", body, headers, Deadline::after_ms(10'000));
    CRESCENT_CHECK(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
  }
  static std::string body() {
    return json{{"engine_id", "p0"},
                {"dp_rank", 0},
                {"tp_rank", 0},
                {"pp_rank", 0},
                {"addr", "tcp://127.0.0.1:1"}}
        .dump();
  }
  std::unique_ptr<BootstrapServer> server_;
  std::unique_ptr<net::http::HttpClient> client_;
};

TEST_F(SignedBootstrapTest, UnsignedRegistrationIsRefused401WithAJsonError) {
  auto r = post(body());
  EXPECT_EQ(r.status, 401);
  auto error = json::parse(r.body).at("error");
  EXPECT_EQ(error.at("code"), "unauthorized");
  EXPECT_EQ(error.at("type"), "authentication_error");
  EXPECT_TRUE(contains(error.at("message").get<std::string>(), "no Authorization header"));
  EXPECT_EQ(r.header("www-authenticate"), "Crescent-HMAC-SHA256");
}

TEST_F(SignedBootstrapTest, ReplayedRegistrationIsRefused) {
  const std::string header = sign_request(kToken, "POST", "/register", body(), unix_seconds_now());
  EXPECT_EQ(post(body(), {{"Authorization", header}}).status, 200);
  auto replay = post(body(), {{"Authorization", header}});
  EXPECT_EQ(replay.status, 401);
  EXPECT_TRUE(contains(replay.body, "replayed")) << replay.body;
}

TEST_F(SignedBootstrapTest, ClientSignsWithItsTokenAndQueriesStayOpen) {
  WorkerRegistration reg;
  reg.engine_id = "p0";
  reg.addr = "tcp://127.0.0.1:1";
  reg.auth_token = "another-token-000000000";
  Status wrong = register_worker(server_->url(), reg, Deadline::after_ms(10'000));
  EXPECT_FALSE(wrong.is_ok());
  EXPECT_TRUE(contains(wrong.message(), "wrong Authorization signature")) << wrong.to_string();
  reg.auth_token = kToken;
  Status ok = register_worker(server_->url(), reg, Deadline::after_ms(10'000));
  ASSERT_TRUE(ok.is_ok()) << ok.to_string();
  // Renewals are signed the same way, each with a fresh nonce.
  ASSERT_TRUE(register_worker(server_->url(), reg, Deadline::after_ms(10'000)).is_ok());
  auto table = query(server_->url(), Deadline::after_ms(10'000));
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  EXPECT_EQ(table->at(0).engine_id, "p0");
}

}  // namespace
}  // namespace crescent::bootstrap
