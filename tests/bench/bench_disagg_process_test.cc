// The real `crescent bench disagg` on the tiny model: it starts a prefill server, a decode
// server and a proxy of its own, measures a few requests and must report every phase of the
// TTFT breakdown and the transfer-vs-memcpy comparison (printed and in --json), stop every
// child it started (their logs end with "stopped"), stop them too when interrupted, and refuse
// bad flags with a message before starting anything.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/child_process.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class BenchDisaggProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ensure_test_model("tiny");
    dir_ = fs::temp_directory_path() /
           ("crescent-bench-disagg-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) {
      fs::remove_all(dir_);
    }
  }

  std::vector<std::string> args(int num_requests) const {
    return {"bench",
            "disagg",
            "--model",
            model_,
            "--num-requests",
            std::to_string(num_requests),
            "--prompt-len",
            "96",
            "--output-len",
            "2",
            "--kv-cache-mb",
            "16",
            "--memcpy-reps",
            "1",
            "--startup-timeout",
            "120",
            "--request-timeout",
            "60",
            "--log-dir",
            (dir_ / "logs").string(),
            "--json",
            (dir_ / "out.json").string()};
  }

  // Every child's log ends with its "stopped" line: none was left running or killed.
  void expect_children_stopped() const {
    for (const char* name : {"prefill", "decode", "proxy"}) {
      std::ifstream in(dir_ / "logs" / (std::string(name) + ".log"));
      ASSERT_TRUE(in.good()) << name << ".log is missing";
      std::stringstream text;
      text << in.rdbuf();
      EXPECT_NE(text.str().find("stopped ("), std::string::npos)
          << name << " did not stop cleanly:\n"
          << text.str();
    }
  }

  std::string model_;
  fs::path dir_;
};

TEST_F(BenchDisaggProcessTest, ReportsEveryPhaseAndTheMemcpyRatioThenStopsItsChildren) {
  auto bench = ChildProcess::start("bench", args(2));
  ASSERT_TRUE(bench.is_ok()) << bench.status().to_string();
  ChildProcess& p = **bench;
  ASSERT_EQ(p.wait_exit(Deadline::after_ms(240'000)), 0) << p.output();
  const std::string out = p.raw_output();
  for (const char* line :
       {"TTFT breakdown, 2 requests", "bootstrap lookup", "wait (P queue", "transfer (P's write)",
        "decode-side recompute", "client TTFT", "KV transfer vs memcpy", "transfer / memcpy:"}) {
    EXPECT_NE(out.find(line), std::string::npos) << "no '" << line << "' in:\n" << out;
  }
  std::ifstream in(dir_ / "out.json");
  ASSERT_TRUE(in.good()) << out;
  json j = json::parse(in, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["num_requests"], 2);
  EXPECT_EQ(j["kv_transport"], "shm");
  ASSERT_TRUE(j["requests"].is_array());
  ASSERT_EQ(j["requests"].size(), 3u) << "the warm-up and two measured requests";
  EXPECT_TRUE(j["requests"][0]["warmup"].get<bool>());
  const uint64_t bytes = j["transfer_vs_memcpy"]["num_bytes"].get<uint64_t>();
  EXPECT_GT(bytes, 0u);
  for (size_t i = 1; i < j["requests"].size(); ++i) {
    const json& r = j["requests"][i];
    EXPECT_EQ(r["num_bytes"].get<uint64_t>(), bytes) << "every 96-token prompt moves as much KV";
    EXPECT_GT(r["transfer_s"].get<double>(), 0) << r.dump();
    EXPECT_GT(r["client_ttft_s"].get<double>(), r["transfer_s"].get<double>()) << r.dump();
  }
  const json& copy = j["transfer_vs_memcpy"];
  EXPECT_GT(copy["transfer_seconds"]["best"].get<double>(), 0);
  EXPECT_GT(copy["touched"]["best"].get<double>(), 0);
  EXPECT_GT(copy["ratio_best"].get<double>(), 0);
  EXPECT_TRUE(copy["target_applies"].get<bool>());
  for (const char* key : {"proxy_s", "bootstrap_s", "wait_s", "transfer_s", "recompute_s",
                          "other_s", "client_ttft_s"}) {
    EXPECT_TRUE(j["summary_seconds"].contains(key)) << key;
  }
  expect_children_stopped();
}

// The EPD encoder split: EC transfers of image embeddings against a same-run memcpy, over shm
// and tcp, in seconds (small shapes); every line of the report and the JSON figures.
TEST_F(BenchDisaggProcessTest, EncodeSplitReportsFetchLatencyAndTheMemcpyRatio) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    const fs::path json_path = dir_ / (std::string("ec-") + transport + ".json");
    auto bench = ChildProcess::start(
        "bench", {"bench", "disagg", "--encode", "--ec-transport", transport, "--tokens", "16,64",
                  "--hidden-size", "256", "--num-images", "5", "--json", json_path.string()});
    ASSERT_TRUE(bench.is_ok()) << bench.status().to_string();
    ChildProcess& p = **bench;
    ASSERT_EQ(p.wait_exit(Deadline::after_ms(60'000)), 0) << p.output();
    const std::string out = p.raw_output();
    for (const std::string& line :
         {std::string("over ") + transport + "; 5 images per shape",
          std::string("EC transfer vs memcpy, per image"), std::string("16 x 256 (0.02 MiB)"),
          std::string("64 x 256 (0.06 MiB)"), std::string("first fetch (HELLO"),
          std::string("EC transfer / memcpy, 16 tokens: "),
          std::string("EC transfer / memcpy, 64 tokens: "), std::string("fixed cost of a fetch"),
          std::string("beyond it, 64 tokens: "), std::string("load average: ")}) {
      EXPECT_NE(out.find(line), std::string::npos) << "no '" << line << "' in:\n" << out;
    }
    const bool is_shm = std::string(transport) == "shm";
    EXPECT_EQ(out.find("target <= 2.0: ") != std::string::npos, is_shm) << out;
    std::ifstream in(json_path);
    ASSERT_TRUE(in.good()) << out;
    json j = json::parse(in, nullptr, false);
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_EQ(j["ec_transport"], transport);
    EXPECT_EQ(j["target_applies"].get<bool>(), is_shm);
    ASSERT_EQ(j["shapes"].size(), 2u) << j.dump();
    for (const json& s : j["shapes"]) {
      EXPECT_EQ(s["num_bytes"].get<uint64_t>(), s["num_tokens"].get<uint64_t>() * 256 * 4);
      EXPECT_EQ(s["fetch_seconds"]["samples"].size(), 5u);
      EXPECT_EQ(s["memcpy_seconds"]["samples"].size(), 5u);
      EXPECT_GT(s["fetch_seconds"]["best"].get<double>(), 0);
      EXPECT_GT(s["memcpy_seconds"]["best"].get<double>(), 0);
      EXPECT_GT(s["ratio_median"].get<double>(), 0);
    }
    EXPECT_GT(j["fixed_fetch_seconds"]["median"].get<double>(), 0);
  }
}

TEST_F(BenchDisaggProcessTest, InterruptStopsEveryChildAndExits130) {
  auto bench = ChildProcess::start("bench", args(10000));
  ASSERT_TRUE(bench.is_ok()) << bench.status().to_string();
  ChildProcess& p = **bench;
  auto deadline = Deadline::after_ms(120'000);
  while (p.raw_output().find("#2 ") == std::string::npos && p.is_running() &&
         !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(p.is_running()) << "it ended before it was interrupted:\n" << p.output();
  p.signal(SIGINT);
  EXPECT_EQ(p.wait_exit(Deadline::after_ms(30'000)), 130) << p.output();
  EXPECT_NE(p.raw_output().find("bench disagg: interrupted"), std::string::npos) << p.output();
  expect_children_stopped();
}

TEST_F(BenchDisaggProcessTest, BadFlagsAreRefusedBeforeAnythingStarts) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"bench", "disagg"}, 2, "--model DIR is required"},
      {{"bench", "disagg", "--model", model_, "--kv-transport", "pigeon"},
       2,
       "--kv-transport must be shm, tcp or ucx, got 'pigeon'"},
      {{"bench", "disagg", "--model", model_, "--num-requests", "0"}, 2, "--num-requests"},
      {{"bench", "disagg", "--model", (dir_ / "no-such-model").string()}, 2, "does not exist"},
      {{"bench", "disagg", "--model", model_, "--no-such-flag", "1"}, 2, "no-such-flag"},
      {{"bench", "disagg", "--encode", "--ec-transport", "pigeon"},
       2,
       "--ec-transport must be shm, tcp or ucx, got 'pigeon'"},
      {{"bench", "disagg", "--encode", "--tokens", "256,x"}, 2, "--tokens expects"},
      {{"bench", "disagg", "--encode", "--num-images", "0"}, 2, "--num-images must be"},
  };
  for (const Case& c : cases) {
    auto bench = ChildProcess::start("bench", c.args);
    ASSERT_TRUE(bench.is_ok()) << bench.status().to_string();
    EXPECT_EQ((*bench)->wait_exit(Deadline::after_ms(30'000)), c.code) << (*bench)->output();
    EXPECT_NE((*bench)->raw_output().find(c.message), std::string::npos)
        << "expected '" << c.message << "' in:\n"
        << (*bench)->output();
  }
  EXPECT_FALSE(fs::exists(dir_ / "logs")) << "a refused run started something";
}

}  // namespace
}  // namespace crescent::testing
