// The real `crescent bench serve` binary against the real `crescent serve` on the tiny model
// (both on 127.0.0.1), and against an in-process stand-in server that fails every third
// request: the JSON result and the printed report count what happened.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/fake_openai_server.h"
#include "server/serve_process.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

using json = nlohmann::json;

struct BenchRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `crescent bench serve ARGS` with a 120 s limit (timeout(1) kills it past that).
BenchRun bench_serve(const std::vector<std::string>& args) {
  std::string cmd = "timeout -k 5 120 " + crescent_binary() + " bench serve";
  for (const auto& a : args) {
    cmd += " '" + a + "'";
  }
  cmd += " 2>&1";
  BenchRun run;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return run;
  }
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    run.output.append(buf, n);
  }
  int status = pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

class TempDir {
 public:
  TempDir() {
    path_ =
        std::filesystem::temp_directory_path() /
        ("crescent-bench-process-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

TEST(BenchServeProcessTest, RealServerTinyModel) {
  const std::string model = ensure_test_model("tiny");
  ServeProcess server({"--model", model, "--served-model-name", "tiny", "--threads", "1",
                       "--max-model-len", "256", "--kv-cache-mb", "64"});
  TempDir dir;
  BenchRun run = bench_serve({"--base-url",
                              "http://127.0.0.1:" + std::to_string(server.port()),
                              "--model",
                              model,
                              "--dataset-name",
                              "random",
                              "--random-input-len",
                              "16",
                              "--random-output-len",
                              "4",
                              "--num-prompts",
                              "8",
                              "--request-rate",
                              "inf",
                              "--max-concurrency",
                              "4",
                              "--seed",
                              "1",
                              "--save-result",
                              dir.file("result.json"),
                              "--save-detailed",
                              "--no-progress"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("Successful requests:                     8"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("Failed requests:                         0"), std::string::npos);
  EXPECT_NE(run.output.find("First model name: tiny"), std::string::npos);
  json j = read_json(dir.file("result.json"));
  ASSERT_TRUE(j.is_object()) << run.output;
  EXPECT_EQ(j["completed"], 8);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["model_id"], "tiny");
  EXPECT_EQ(j["num_prompts"], 8);
  EXPECT_EQ(j["max_concurrency"], 4);
  // ignore_eos is sent for random prompts: every request gives exactly 4 tokens, as usage
  // says; the prompts are 16 tokens of the model's own vocabulary (no BOS for Qwen3).
  EXPECT_EQ(j["total_output_tokens"], 8 * 4);
  EXPECT_EQ(j["output_lens"], json(std::vector<int>(8, 4)));
  EXPECT_EQ(j["total_input_tokens"], 8 * 16);
  EXPECT_EQ(j["input_lens"], json(std::vector<int>(8, 16)));
  for (const auto& itl : j["itls"]) {
    EXPECT_EQ(itl.size(), 3u);  // the server streams one token per chunk
  }
  for (const char* key : {"mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                          "mean_e2el_ms", "request_throughput", "output_throughput"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }
  EXPECT_GE(j["mean_e2el_ms"].get<double>(), j["mean_ttft_ms"].get<double>());
  std::ifstream svg(dir.file("result.svg"));
  std::string first_line;
  std::getline(svg, first_line);
  EXPECT_EQ(first_line.rfind("<?xml", 0), 0u);
  EXPECT_EQ(server.terminate(), 0) << server.output();
}

// vLLM's meaning of --model: a name, not a directory here. The prompts are made through the
// server's /tokenize and /detokenize and still have exactly the asked-for token counts.
TEST(BenchServeProcessTest, RealServerWithoutALocalTokenizer) {
  ServeProcess server({"--model", ensure_test_model("tiny"), "--served-model-name",
                       "org/tiny-instruct", "--threads", "1", "--max-model-len", "256",
                       "--kv-cache-mb", "64"});
  TempDir dir;
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  BenchRun run = bench_serve({"--base-url",
                              url,
                              "--model",
                              "org/tiny-instruct",
                              "--dataset-name",
                              "random",
                              "--random-input-len",
                              "24",
                              "--random-output-len",
                              "3",
                              "--random-prefix-len",
                              "8",
                              "--num-prompts",
                              "6",
                              "--max-concurrency",
                              "3",
                              "--seed",
                              "5",
                              "--save-result",
                              dir.file("r.json"),
                              "--no-progress"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("Tokenizer: the server's (" + url + "/tokenize)"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("Model not specified"), std::string::npos)
      << "--model names the served model: " << run.output;
  json j = read_json(dir.file("r.json"));
  ASSERT_TRUE(j.is_object()) << run.output;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["model_id"], "org/tiny-instruct");
  EXPECT_EQ(j["tokenizer_id"], url + "/tokenize");
  // usage.prompt_tokens as the server counted them: 8 shared + 24 own, no BOS for Qwen3.
  EXPECT_EQ(j["total_input_tokens"], 6 * 32);
  EXPECT_EQ(j["total_output_tokens"], 6 * 3);
  EXPECT_EQ(server.terminate(), 0) << server.output();
}

// vLLM's prefix_repetition flags: 7 prompts over 3 prefixes are 6 requests (7 / 3 each), every
// one 16 + 8 tokens as the server counts them.
TEST(BenchServeProcessTest, PrefixRepetitionWithVllmFlags) {
  ServeProcess server({"--model", ensure_test_model("tiny"), "--served-model-name", "tiny",
                       "--threads", "1", "--max-model-len", "256", "--kv-cache-mb", "64"});
  TempDir dir;
  BenchRun run = bench_serve({"--base-url",
                              "http://127.0.0.1:" + std::to_string(server.port()),
                              "--model",
                              "tiny",
                              "--dataset-name",
                              "prefix_repetition",
                              "--prefix-repetition-prefix-len",
                              "16",
                              "--prefix-repetition-suffix-len",
                              "8",
                              "--prefix-repetition-num-prefixes",
                              "3",
                              "--prefix-repetition-output-len",
                              "2",
                              "--num-prompts",
                              "7",
                              "--max-concurrency",
                              "2",
                              "--save-result",
                              dir.file("r.json"),
                              "--no-progress"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  json j = read_json(dir.file("r.json"));
  ASSERT_TRUE(j.is_object()) << run.output;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["total_input_tokens"], 6 * 24);
  EXPECT_EQ(j["total_output_tokens"], 6 * 2);
  EXPECT_EQ(server.terminate(), 0) << server.output();
}

TEST(BenchServeProcessTest, FailingServerIsCountedAndItsFirstErrorShown) {
  auto fake = bench::FakeOpenAiServer::start([](int n) {
    return n % 3 == 0 ? bench::FakeOpenAiServer::Failure::kHttp500
                      : bench::FakeOpenAiServer::Failure::kNone;
  });
  ASSERT_TRUE(fake.is_ok()) << fake.status().to_string();
  TempDir dir;
  // One request at a time: the test request is the server's #1 and request i its #(i + 2),
  // so requests 1, 4 and 7 fail.
  BenchRun run = bench_serve({"--port",
                              std::to_string((*fake)->port()),
                              "--model",
                              ensure_test_model("tiny"),
                              "--dataset-name",
                              "random",
                              "--random-input-len",
                              "16",
                              "--random-output-len",
                              "4",
                              "--num-prompts",
                              "9",
                              "--max-concurrency",
                              "1",
                              "--request-rate",
                              "50",
                              "--burstiness",
                              "2",
                              "--save-result",
                              dir.file("r.json"),
                              "--no-progress"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("Successful requests:                     6"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("Failed requests:                         3"), std::string::npos);
  EXPECT_NE(run.output.find("Error 0 (request 1): HTTP 500 Internal Server Error: "
                            "injected failure #3"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("Request rate configured (RPS):           50.00"), std::string::npos);
  EXPECT_NE(run.output.find("Burstiness factor: 2.0 (Gamma distribution)"), std::string::npos);
  json j = read_json(dir.file("r.json"));
  ASSERT_TRUE(j.is_object()) << run.output;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 3);
  EXPECT_EQ(j["model_id"], "fake-model");
  EXPECT_EQ(j["total_output_tokens"], 6 * 4);
  ASSERT_EQ(j["first_errors"].size(), 3u);
  EXPECT_EQ(j["first_errors"][2]["request"], 7);
  EXPECT_EQ(j["first_errors"][2]["error"], "HTTP 500 Internal Server Error: injected failure #9");
  EXPECT_EQ((*fake)->num_requests(), 10);
}

TEST(BenchServeProcessTest, BadFlagsAreRefusedWithAMessage) {
  BenchRun run = bench_serve({"--model", ensure_test_model("tiny"), "--dataset-name", "sharegpt"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("--dataset-name sharegpt needs --dataset-path"), std::string::npos)
      << run.output;
  run = bench_serve({"--model", ensure_test_model("tiny"), "--goodput", "ttft:100", "p99_itl:5"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("unknown metric 'p99_itl'"), std::string::npos) << run.output;
  run = bench_serve({"--model", "/nonexistent", "--port", "1", "--served-model-name", "m"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.output.find("loading the tokenizer of /nonexistent"), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace crescent::testing
