// The server over real HTTP on 127.0.0.1, and the blocking client functions against it.

#include "bootstrap/bootstrap_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "bootstrap/bootstrap_client.h"
#include "net/http/http_client.h"
#include "net/socket.h"

namespace crescent::bootstrap {
namespace {

using nlohmann::json;

Deadline soon() {
  return Deadline::after_ms(10'000);
}

std::unique_ptr<BootstrapServer> start_server(int expected_dp_ranks, int port = 0) {
  BootstrapServerOptions options;
  options.port = port;
  options.expected_dp_ranks = expected_dp_ranks;
  auto server = BootstrapServer::start(options);
  CRESCENT_CHECK(server.is_ok()) << server.status().to_string();
  return std::move(server).value();
}

std::string reg_body(const std::string& id, int dp, int tp, int pp, const std::string& addr) {
  return json{{"engine_id", id}, {"dp_rank", dp}, {"tp_rank", tp}, {"pp_rank", pp}, {"addr", addr}}
      .dump();
}

class BootstrapServerTest : public ::testing::Test {
 protected:
  void start(int expected_dp_ranks) {
    server_ = start_server(expected_dp_ranks);
    client_ = std::make_unique<net::http::HttpClient>("127.0.0.1", server_->port());
  }
  net::http::Response call(const std::string& method, const std::string& path,
                           std::string body = "") {
    auto r = client_->request(method, path, std::move(body), {}, soon());
    CRESCENT_CHECK(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
  }
  static std::string message_of(const net::http::Response& r) {
    return json::parse(r.body).at("error").at("message").get<std::string>();
  }
  std::unique_ptr<BootstrapServer> server_;
  std::unique_ptr<net::http::HttpClient> client_;
};

TEST_F(BootstrapServerTest, RegisterThenQueryInTheVllmShape) {
  start(1);
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()));
  auto r = call("POST", "/register", reg_body("prefill-a", 0, 0, 0, "tcp://127.0.0.1:7000"));
  EXPECT_EQ(r.status, 200);
  // vLLM's {"status":"ok"}, plus the dp rank's epoch.
  EXPECT_EQ(json::parse(r.body), json({{"status", "ok"}, {"epoch", 1}}));
  EXPECT_EQ(r.header("content-type"), "application/json");
  call("POST", "/register", reg_body("prefill-a", 0, 1, 0, "tcp://127.0.0.1:7001"));
  auto q = call("GET", "/query");
  ASSERT_EQ(q.status, 200) << q.body;
  EXPECT_EQ(
      json::parse(q.body),
      json::parse(R"({"0":{"engine_id":"prefill-a","epoch":1,"worker_addr":)"
                  R"({"0":{"0":"tcp://127.0.0.1:7000"},"1":{"0":"tcp://127.0.0.1:7001"}}}})"));
}

TEST_F(BootstrapServerTest, QueryIs503ListingMissingRanksUntilAllRegister) {
  start(2);
  auto before = call("GET", "/query");
  EXPECT_EQ(before.status, 503);
  EXPECT_EQ(json::parse(before.body)["error"]["code"], "not_ready");
  EXPECT_NE(message_of(before).find("dp rank(s) 0, 1"), std::string::npos) << before.body;
  call("POST", "/register", reg_body("b", 1, 0, 0, "tcp://127.0.0.1:7001"));
  auto partial = call("GET", "/query");
  EXPECT_EQ(partial.status, 503);
  EXPECT_NE(message_of(partial).find("dp rank(s) 0 to register (1 of 2 registered)"),
            std::string::npos)
      << partial.body;
  call("POST", "/register", reg_body("a", 0, 0, 0, "tcp://127.0.0.1:7000"));
  auto all = call("GET", "/query");
  ASSERT_EQ(all.status, 200);
  EXPECT_EQ(json::parse(all.body)["1"]["engine_id"], "b");
}

TEST_F(BootstrapServerTest, IdenticalIsOkConflictIs400NamingBoth) {
  start(2);
  // A live owner: its address answers the probe.
  auto listener = net::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.is_ok());
  const std::string live = "tcp://127.0.0.1:" + std::to_string(*net::local_port(*listener));
  ASSERT_EQ(call("POST", "/register", reg_body("a", 0, 0, 0, live)).status, 200);
  EXPECT_EQ(call("POST", "/register", reg_body("a", 0, 0, 0, live)).status, 200);
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {reg_body("x", 0, 1, 0, "tcp://127.0.0.1:7009"),
       "conflicting registration: dp_rank 0 is registered by engine_id 'a', not 'x' (it holds "
       "no lease and " +
           live + " answers)"},
      {reg_body("a", 1, 0, 0, "tcp://127.0.0.1:7009"),
       "conflicting registration: engine_id 'a' is registered at dp_rank 0, not dp_rank 1"},
      {reg_body("a", 0, 0, 0, "tcp://127.0.0.1:7009"),
       "conflicting registration: dp_rank 0 tp_rank 0 pp_rank 0 is registered at " + live +
           ", not tcp://127.0.0.1:7009"},
  };
  for (const auto& c : cases) {
    auto r = call("POST", "/register", c.body);
    EXPECT_EQ(r.status, 400) << c.body;
    EXPECT_EQ(message_of(r), c.message);
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "registration_conflict");
    EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
  }
}

TEST_F(BootstrapServerTest, BadRegistrationsAre400WithTheReason) {
  start(2);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "the body is not valid JSON"},
      {R"({"engine_id":"a"})", "missing field 'dp_rank'"},
      {reg_body("a", 2, 0, 0, "tcp://127.0.0.1:1"), "dp_rank 2 is outside 0..1"},
      {reg_body("a", 0, -1, 0, "tcp://127.0.0.1:1"), "'tp_rank' must be in 0..1023, got -1"},
      {reg_body("a", 0, 0, 0, "127.0.0.1:1"), "expected tcp://host:port"},
      {reg_body("", 0, 0, 0, "tcp://127.0.0.1:1"), "'engine_id' must not be empty"},
  };
  for (const auto& [body, reason] : cases) {
    auto r = call("POST", "/register", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(message_of(r).find("bad registration: "), std::string::npos) << r.body;
    EXPECT_NE(message_of(r).find(reason), std::string::npos) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "invalid_registration");
  }
  // Nothing was stored by the refused ones.
  EXPECT_EQ(call("GET", "/query").status, 503);
}

// A number a double cannot hold is a bad registration naming the number, not a handler's
// exception; the server goes on registering.
TEST_F(BootstrapServerTest, NumberOverflowIs400AndTheServerKeepsServing) {
  start(1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model":"x","max_tokens":1e400})", "1e400"},
      {R"({"messages":[{"role":"user","content":"hi"}],"temperature":-1e400})", "-1e400"},
      {R"({"engine_id":"a","dp_rank":1e400,"tp_rank":0,"pp_rank":0,"addr":"tcp://127.0.0.1:1"})",
       "1e400"},
      {R"({"engine_id":"a","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://127.0.0.1:1",)"
       R"("extra":{"x":[-2e999]}})",
       "-2e999"},
  };
  for (const auto& [body, number] : cases) {
    auto r = call("POST", "/register", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "invalid_registration");
    EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
    const std::string message = message_of(r);
    EXPECT_NE(message.find("the body has a number out of range"), std::string::npos) << message;
    EXPECT_NE(message.find(number + " does not fit in a double"), std::string::npos) << message;
  }
  EXPECT_EQ(call("GET", "/query").status, 503);  // nothing stored
  EXPECT_EQ(call("POST", "/register", reg_body("a", 0, 0, 0, "tcp://127.0.0.1:7000")).status, 200);
  EXPECT_EQ(call("GET", "/query").status, 200);
}

TEST_F(BootstrapServerTest, OversizedBodyIs413) {
  start(1);
  std::string big(64 << 10, ' ');
  auto r = client_->request("POST", "/register", big, {}, soon());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->status, 413);
}

TEST_F(BootstrapServerTest, UnknownPathIs404WrongMethodIs405) {
  start(1);
  auto missing = call("GET", "/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(message_of(missing).find("/nope"), std::string::npos);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"GET", "/register", "POST"},
      {"PUT", "/register", "POST"},
      {"POST", "/query", "GET"},
      {"DELETE", "/health", "GET"},
  };
  for (const auto& [method, path, allowed] : cases) {
    auto r = call(method, path, method == "GET" ? "" : "{}");
    EXPECT_EQ(r.status, 405) << method << " " << path;
    EXPECT_EQ(r.header("allow"), allowed);
    EXPECT_NE(message_of(r).find(method + " is not allowed on " + path), std::string::npos);
  }
}

TEST_F(BootstrapServerTest, HealthIs200BeforeAnyRegistration) {
  start(4);
  auto r = call("GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json({{"status", "ok"}}));
}

TEST(BootstrapServerStart, RefusesBadOptionsAndABusyPort) {
  BootstrapServerOptions options;
  options.port = 0;
  options.expected_dp_ranks = 0;
  auto zero = BootstrapServer::start(options);
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.status().message().find("expected_dp_ranks must be in 1..1024, got 0"),
            std::string::npos);
  options.expected_dp_ranks = 1;
  options.port = 70000;
  EXPECT_EQ(BootstrapServer::start(options).status().code(), StatusCode::kInvalidArgument);
  auto first = start_server(1);
  options.port = first->port();
  auto busy = BootstrapServer::start(options);
  ASSERT_FALSE(busy.is_ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kUnavailable) << busy.status().to_string();
}

// --- the client functions ---

TEST(BootstrapClient, RegisterAndQuery) {
  auto server = start_server(2);
  const std::string url = server->url();
  auto not_ready = query(url, soon());
  ASSERT_FALSE(not_ready.is_ok());
  EXPECT_EQ(not_ready.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(not_ready.status().message().find("503"), std::string::npos);
  EXPECT_NE(not_ready.status().message().find("dp rank(s) 0, 1"), std::string::npos)
      << not_ready.status().message();

  ASSERT_TRUE(register_worker(url, {"p0", 0, 0, 0, "tcp://127.0.0.1:7000"}, soon()).is_ok());
  ASSERT_TRUE(register_worker(url + "/", {"p1", 1, 0, 0, "tcp://127.0.0.1:7100"}, soon()).is_ok());
  ASSERT_TRUE(register_worker(url, {"p1", 1, 0, 1, "tcp://127.0.0.1:7101"}, soon()).is_ok());
  auto table = query(url, soon());
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  ASSERT_EQ(table->size(), 2u);
  EXPECT_EQ(table->at(0).engine_id, "p0");
  EXPECT_EQ(table->at(1).worker_addr.at(0).at(1), "tcp://127.0.0.1:7101");

  Status conflict = register_worker(url, {"p0", 0, 0, 0, "tcp://127.0.0.1:7999"}, soon());
  EXPECT_EQ(conflict.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(conflict.message().find("is registered at tcp://127.0.0.1:7000, not "
                                    "tcp://127.0.0.1:7999"),
            std::string::npos)
      << conflict.message();
  Status bad = register_worker(url, {"p0", 0, 0, 0, "nope"}, soon());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("bad address 'nope'"), std::string::npos) << bad.message();
}

TEST(BootstrapClient, BadUrlsAreRefusedBeforeAnyIo) {
  for (std::string url : {"127.0.0.1:8998", "http://h:1/x", "http://h"}) {
    EXPECT_EQ(register_worker(url, {"a", 0, 0, 0, "tcp://h:1"}, soon()).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(query(url, soon()).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(register_with_retry(url, {"a", 0, 0, 0, "tcp://h:1"}, soon()).code(),
              StatusCode::kInvalidArgument);
  }
}

// A port nobody listens on (bound, then closed).
int closed_port() {
  auto fd = net::listen_tcp("127.0.0.1", 0);
  CRESCENT_CHECK(fd.is_ok()) << fd.status().to_string();
  auto port = net::local_port(*fd);
  CRESCENT_CHECK(port.is_ok());
  return *port;
}

TEST(BootstrapClient, RetryWaitsForAServerThatStartsLater) {
  const int port = closed_port();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  std::unique_ptr<BootstrapServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    server = start_server(1, port);
  });
  auto t0 = std::chrono::steady_clock::now();
  Status s = register_with_retry(url, {"late", 0, 0, 0, "tcp://127.0.0.1:7000"}, soon());
  auto elapsed = std::chrono::steady_clock::now() - t0;
  starter.join();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  // 100 + 200 + 400 ms of backoff reaches past the 400 ms start.
  EXPECT_GE(elapsed, std::chrono::milliseconds(300));
  EXPECT_LT(elapsed, std::chrono::milliseconds(3000));
  EXPECT_TRUE(query(url, soon()).is_ok());
}

TEST(BootstrapClient, RetryReturnsAConflictAtOnce) {
  auto server = start_server(1);
  auto listener = net::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.is_ok());
  const std::string live = "tcp://127.0.0.1:" + std::to_string(*net::local_port(*listener));
  ASSERT_TRUE(register_worker(server->url(), {"a", 0, 0, 0, live}, soon()).is_ok());
  auto t0 = std::chrono::steady_clock::now();
  Status s = register_with_retry(server->url(), {"b", 0, 0, 0, "tcp://h:2"}, soon());
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
}

TEST(BootstrapClient, RetryGivesUpAtTheDeadline) {
  const std::string url = "http://127.0.0.1:" + std::to_string(closed_port());
  auto t0 = std::chrono::steady_clock::now();
  Status s = register_with_retry(url, {"a", 0, 0, 0, "tcp://h:1"}, Deadline::after_ms(700));
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("attempt(s); last: UNAVAILABLE"), std::string::npos) << s.message();
  EXPECT_GE(elapsed, std::chrono::milliseconds(650));
  EXPECT_LT(elapsed, std::chrono::milliseconds(1500));
}

TEST_F(BootstrapServerTest, EncodersRegisterWithARoleAndAreQueriedApart) {
  start(1);
  // An encoder registers with "role": "encode" and no ranks.
  auto r = call(
      "POST", "/register",
      json{{"engine_id", "encode-a"}, {"addr", "tcp://127.0.0.1:7500"}, {"role", "encode"}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  // /query stays vLLM's: 503 until dp rank 0 registers, and never lists encoders.
  EXPECT_EQ(call("GET", "/query").status, 503);
  ASSERT_EQ(
      call("POST", "/register", reg_body("prefill-a", 0, 0, 0, "tcp://127.0.0.1:7000")).status,
      200);
  auto q = call("GET", "/query");
  ASSERT_EQ(q.status, 200) << q.body;
  EXPECT_EQ(
      json::parse(q.body),
      json::parse(
          R"({"0":{"engine_id":"prefill-a","epoch":1,"worker_addr":{"0":{"0":"tcp://127.0.0.1:7000"}}}})"));
  auto e = call("GET", "/query?role=encode");
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(json::parse(e.body),
            json::parse(R"({"encode-a":{"role":"encode","worker_addr":"tcp://127.0.0.1:7500"}})"));
  // Unknown roles are refused, on both endpoints.
  auto bad =
      call("POST", "/register",
           json{{"engine_id", "x"}, {"addr", "tcp://127.0.0.1:7600"}, {"role", "decode"}}.dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(message_of(bad).find("role"), std::string::npos) << bad.body;
  EXPECT_EQ(call("GET", "/query?role=decode").status, 400);

  // The client functions.
  WorkerRegistration second;
  second.engine_id = "encode-b";
  second.addr = "tcp://127.0.0.1:7501";
  second.role = std::string(kEncodeRole);
  ASSERT_TRUE(register_with_retry(server_->url(), second, soon()).is_ok());
  auto encoders = query_encoders(server_->url(), soon());
  ASSERT_TRUE(encoders.is_ok()) << encoders.status().to_string();
  EXPECT_EQ(*encoders, (EncoderTable{{"encode-a", "tcp://127.0.0.1:7500"},
                                     {"encode-b", "tcp://127.0.0.1:7501"}}));
  second.addr = "tcp://127.0.0.1:7502";
  EXPECT_EQ(register_worker(server_->url(), second, soon()).code(), StatusCode::kAlreadyExists);
}

TEST_F(BootstrapServerTest, EncodersAreListedBeforeAnyDpRank) {
  start(2);
  EXPECT_EQ(json::parse(call("GET", "/query?role=encode").body), json::object());
}

}  // namespace
}  // namespace crescent::bootstrap
