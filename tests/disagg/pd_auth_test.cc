// --auth-token-file across a disaggregated deployment, all real processes on the tiny model: a
// standalone `crescent bootstrap`, a `serve --role prefill` registered with it, and two
// `--role decode` servers, one with the same token file and one with another. The bootstrap
// refuses an unsigned POST /register with a 401 JSON error; the matching pair completes; the
// decode server with the wrong token fails its request with a clear error within the deadline,
// the prefill server frees the blocks it held for it and counts the refused connection.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "core/ids.h"
#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "net/http/http_client.h"

namespace crescent::testing {
namespace {

std::string write_token_file(const std::string& name, const std::string& token) {
  const std::string path =
      ::testing::TempDir() + "pd_auth_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << token << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class PdAuthTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (Node* node : {&decode_wrong_, &decode_, &prefill_, &bootstrap_}) {
      if (node->process) {
        EXPECT_EQ(node->process->terminate(Deadline::after_ms(30'000)), 0) << node->process->name();
      }
    }
    if (HasFailure()) {
      std::string out =
          bootstrap_.output() + prefill_.output() + decode_.output() + decode_wrong_.output();
      std::printf("---- process output (last 8000 bytes) ----\n%s\n",
                  (out.size() > 8000 ? out.substr(out.size() - 8000) : out).c_str());
    }
    std::remove(good_file_.c_str());
    std::remove(wrong_file_.c_str());
  }

  // P's half and D's half of one request at once (as the proxy sends them): D's reply.
  Reply direct_pair(const Node& decode, const json& body) {
    const std::string transfer_id = "xfer-auth-" + random_uuid();
    Reply p_reply;
    std::thread p(
        [&] { p_reply = send(prefill_.port, "/v1/completions", prefill_body(body, transfer_id)); });
    Reply d = send(decode.port, "/v1/completions",
                   decode_body(body, transfer_id, bootstrap_.bootstrap_url(), engine_id_));
    p.join();
    EXPECT_TRUE(p_reply.is_ok()) << "prefill half: " << p_reply.describe();
    return d;
  }

  std::string good_file_ = write_token_file("good", "pd-auth-shared-token-7f3a9c21");
  std::string wrong_file_ = write_token_file("wrong", "pd-auth-another-token-0b44e1d8");
  Node bootstrap_, prefill_, decode_, decode_wrong_;
  std::string engine_id_;
};

TEST_F(PdAuthTest, SharedTokenServesAndAWrongTokenIsRefusedClearly) {
  const int bootstrap_port = free_port();
  auto process = ChildProcess::start(
      "bootstrap", {"bootstrap", "--host", "127.0.0.1", "--port", std::to_string(bootstrap_port),
                    "--auth-token-file", good_file_});
  ASSERT_TRUE(process.is_ok()) << process.status().to_string();
  bootstrap_.process = std::move(*process);
  bootstrap_.port = bootstrap_.bootstrap_port = bootstrap_port;
  ASSERT_TRUE(
      bootstrap_.process
          ->wait_healthy(bootstrap_port, Deadline::after(std::chrono::seconds(start_timeout_s())))
          .is_ok())
      << bootstrap_.output();

  // Anyone may reach the port; nobody without the token may register.
  {
    net::http::HttpClient http("127.0.0.1", bootstrap_port);
    auto r = http.request("POST", "/register",
                          R"({"engine_id":"intruder","dp_rank":0,"tp_rank":0,"pp_rank":0,)"
                          R"("addr":"tcp://127.0.0.1:1"})",
                          {{"Content-Type", "application/json"}}, Deadline::after_ms(10'000));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->status, 401) << r->body;
    json error = json::parse(r->body).at("error");
    EXPECT_EQ(error.at("code"), "unauthorized") << r->body;
    EXPECT_EQ(error.at("type"), "authentication_error") << r->body;
  }

  ServeSpec p;
  p.role = "prefill";
  p.bootstrap_addr = bootstrap_.bootstrap_url();
  p.kv_transfer_timeout_s = 3;
  p.extra_args = {"--auth-token-file", good_file_};
  ServeSpec d;
  d.role = "decode";
  d.kv_transfer_timeout_s = 10;
  d.extra_args = {"--auth-token-file", good_file_};
  ServeSpec dw = d;
  dw.extra_args = {"--auth-token-file", wrong_file_};
  auto launched_p = launch_serve("prefill", p);
  auto launched_d = launch_serve("decode", d);
  auto launched_dw = launch_serve("decode-wrong", dw);
  ASSERT_TRUE(launched_p.is_ok()) << launched_p.status().to_string();
  ASSERT_TRUE(launched_d.is_ok()) << launched_d.status().to_string();
  ASSERT_TRUE(launched_dw.is_ok()) << launched_dw.status().to_string();
  prefill_ = std::move(*launched_p);
  decode_ = std::move(*launched_d);
  decode_wrong_ = std::move(*launched_dw);
  for (Node* node : {&prefill_, &decode_, &decode_wrong_}) {
    Status ready = wait_ready(node);
    ASSERT_TRUE(ready.is_ok()) << ready.to_string();
  }
  // The prefill server's signed registration was accepted.
  std::string why;
  for (int i = 0; i < 100 && engine_id_.empty(); ++i) {
    engine_id_ = query_engine_id(bootstrap_.bootstrap_url(), &why);
    if (engine_id_.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(engine_id_.empty()) << why;

  const json body = completion("authenticated prompt: the quick brown fox jumps over it", 6);
  Reply ok = direct_pair(decode_, body);
  EXPECT_TRUE(ok.is_ok()) << ok.describe();
  EXPECT_EQ(ok.usage_of("completion_tokens"), 6) << ok.describe();

  Reply refused = direct_pair(decode_wrong_, body);
  std::printf("decode with the wrong token: %s\n", refused.describe().c_str());
  EXPECT_FALSE(refused.is_ok());
  EXPECT_GE(refused.status, 400) << refused.describe();
  EXPECT_TRUE(contains(refused.error_message, "authentication") ||
              contains(refused.error_message, "token"))
      << refused.describe();
  EXPECT_LT(refused.seconds, 8.0) << refused.describe();
  // P freed what it held for the refused decode server (its deadline at the latest).
  EXPECT_EQ(wait_blocks_used(prefill_.port, 0, Deadline::after_ms(10'000)), 0);
  EXPECT_EQ(wait_blocks_used(decode_wrong_.port, 0, Deadline::after_ms(10'000)), 0);
  EXPECT_GE(wait_metric_at_least(prefill_.port, "crescent_auth_refused_connections_total", {}, 1,
                                 Deadline::after_ms(5000)),
            1);
  // And the good pair still works afterwards.
  Reply again = direct_pair(decode_, body);
  EXPECT_TRUE(again.is_ok()) << again.describe();
  EXPECT_EQ(again.text, ok.text);
}

}  // namespace
}  // namespace crescent::testing
