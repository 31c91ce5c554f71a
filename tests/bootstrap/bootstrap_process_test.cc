// The real `crescent bootstrap` binary: flags, register/query over HTTP through the client,
// the resolver, and a clean exit on SIGTERM.

#include "bootstrap/bootstrap_process.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bootstrap/bootstrap_client.h"
#include "net/http/http_client.h"
#include "net/socket.h"

namespace crescent::testing {
namespace {

using bootstrap::WorkerRegistration;
using nlohmann::json;

Deadline soon() {
  return Deadline::after_ms(10'000);
}

TEST(BootstrapProcess, RegisterQueryResolveThenSigtermExitsZero) {
  BootstrapProcess process({"--port", "0", "--expected-dp-ranks", "2"});
  const int port = process.wait_for_port(20'000);
  ASSERT_GT(port, 0) << process.output();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  EXPECT_NE(process.output().find("listening on " + url + " (expecting 2 dp rank(s))"),
            std::string::npos)
      << process.output();

  net::http::HttpClient http("127.0.0.1", port);
  auto health = http.request("GET", "/health", "", {}, soon());
  ASSERT_TRUE(health.is_ok()) << health.status().to_string();
  EXPECT_EQ(health->status, 200);
  auto not_ready = http.request("GET", "/query", "", {}, soon());
  ASSERT_TRUE(not_ready.is_ok());
  EXPECT_EQ(not_ready->status, 503);

  // Raw HTTP as a vLLM worker would send it, then the client library.
  auto raw = http.request(
      "POST", "/register",
      R"({"engine_id":"prefill-0","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://127.0.0.1:7000"})",
      {{"Content-Type", "application/json"}}, soon());
  ASSERT_TRUE(raw.is_ok());
  EXPECT_EQ(raw->status, 200) << raw->body;
  EXPECT_EQ(json::parse(raw->body)["status"], "ok");
  // prefill-1 is alive (something answers at its address), so prefill-2 may not replace it.
  auto listener = net::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.is_ok());
  const std::string live = "tcp://127.0.0.1:" + std::to_string(*net::local_port(*listener));
  ASSERT_TRUE(
      bootstrap::register_with_retry(url, WorkerRegistration{"prefill-1", 1, 0, 0, live}, soon())
          .is_ok());
  Status conflict = bootstrap::register_worker(
      url, WorkerRegistration{"prefill-2", 1, 0, 0, "tcp://127.0.0.1:7200"}, soon());
  EXPECT_EQ(conflict.code(), StatusCode::kAlreadyExists) << conflict.to_string();

  auto table = http.request("GET", "/query", "", {}, soon());
  ASSERT_TRUE(table.is_ok());
  ASSERT_EQ(table->status, 200) << table->body;
  EXPECT_EQ(
      json::parse(table->body),
      json::parse(
          R"({"0":{"engine_id":"prefill-0","epoch":1,"worker_addr":{"0":{"0":"tcp://127.0.0.1:7000"}}},)"
          R"("1":{"engine_id":"prefill-1","epoch":1,"worker_addr":{"0":{"0":")" +
          live + R"("}}}})"));
  bootstrap::EngineResolver resolver;
  auto addr = resolver.resolve(url, "prefill-1", soon());
  ASSERT_TRUE(addr.is_ok()) << addr.status().to_string();
  EXPECT_EQ(*addr, live);

  EXPECT_EQ(process.terminate(10'000), 0) << process.output();
  EXPECT_NE(process.output().find("SIGTERM, stopped"), std::string::npos) << process.output();
  // Gone: the port no longer answers.
  auto after = bootstrap::query(url, Deadline::after_ms(2000));
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status().to_string();
}

TEST(BootstrapProcess, HelpExitsZeroAndDescribesTheEndpoints) {
  BootstrapProcess process({"--help"});
  EXPECT_EQ(process.wait_exit(10'000), 0);
  const std::string out = process.output();
  for (const char* s :
       {"crescent bootstrap", "--expected-dp-ranks", "/register", "/query", "/health", "SIGTERM"}) {
    EXPECT_NE(out.find(s), std::string::npos) << s << " in:\n" << out;
  }
}

TEST(BootstrapProcess, BadFlagsAndABusyPortFailWithAMessage) {
  BootstrapProcess bad_ranks({"--port", "0", "--expected-dp-ranks", "0"});
  EXPECT_EQ(bad_ranks.wait_exit(10'000), 1);
  EXPECT_NE(bad_ranks.output().find("expected_dp_ranks must be in 1..1024, got 0"),
            std::string::npos)
      << bad_ranks.output();

  BootstrapProcess first({"--port", "0"});
  const int port = first.wait_for_port(20'000);
  ASSERT_GT(port, 0) << first.output();
  BootstrapProcess second({"--port", std::to_string(port)});
  EXPECT_EQ(second.wait_exit(10'000), 1);
  EXPECT_NE(second.output().find("error: UNAVAILABLE"), std::string::npos) << second.output();
  EXPECT_EQ(first.terminate(10'000), 0);
}

TEST(BootstrapProcess, AuthTokenFileMustHoldAToken) {
  const std::string empty =
      ::testing::TempDir() + "bootstrap_empty_token_" + std::to_string(::getpid());
  { std::ofstream(empty) << "\n"; }
  BootstrapProcess refused({"--port", "0", "--auth-token-file", empty});
  EXPECT_EQ(refused.wait_exit(10'000), 2);
  EXPECT_NE(refused.output().find("--auth-token-file: '" + empty + "' holds no token"),
            std::string::npos)
      << refused.output();
  BootstrapProcess missing({"--port", "0", "--auth-token-file", empty + ".missing"});
  EXPECT_EQ(missing.wait_exit(10'000), 2);
  EXPECT_NE(missing.output().find("cannot read"), std::string::npos) << missing.output();
  std::remove(empty.c_str());

  BootstrapProcess help({"--help"});
  EXPECT_EQ(help.wait_exit(10'000), 0);
  EXPECT_NE(help.output().find("--auth-token-file"), std::string::npos) << help.output();
}

}  // namespace
}  // namespace crescent::testing
