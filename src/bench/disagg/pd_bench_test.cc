#include "bench/disagg/pd_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "bench/disagg/pd_report.h"

namespace crescent::bench {
namespace {

// The options a user gives, pointing at an existing "model" (validation only checks it
// exists; the tokenizer is read when the run starts).
PdBenchOptions options_for(const std::filesystem::path& dir) {
  PdBenchOptions o;
  o.model = dir.string();
  o.log_dir = (dir / "logs").string();
  return o;
}

class PdBenchOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("crescent-pd-bench-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string refusal(PdBenchOptions o) {
    Status s = validate_pd_bench_options(o);
    return s.is_ok() ? "accepted" : s.message();
  }

  std::filesystem::path dir_;
};

TEST_F(PdBenchOptionsTest, AcceptsTheDefaultsAndCreatesTheLogDirectory) {
  PdBenchOptions o = options_for(dir_);
  o.model += "/";
  ASSERT_TRUE(validate_pd_bench_options(o).is_ok());
  EXPECT_TRUE(std::filesystem::is_directory(o.log_dir));
  EXPECT_NE(o.model.back(), '/');
}

TEST_F(PdBenchOptionsTest, MakesATemporaryLogDirectoryWhenNoneIsGiven) {
  PdBenchOptions o = options_for(dir_);
  o.log_dir.clear();
  ASSERT_TRUE(validate_pd_bench_options(o).is_ok());
  EXPECT_NE(o.log_dir.find("crescent-bench-disagg-"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_directory(o.log_dir));
  std::filesystem::remove_all(o.log_dir);
}

TEST_F(PdBenchOptionsTest, RefusesEachBadOptionByItsFlag) {
  PdBenchOptions o = options_for(dir_);
  auto with = [&](auto change) {
    PdBenchOptions bad = o;
    change(bad);
    return refusal(bad);
  };
  EXPECT_NE(with([](auto& b) { b.model.clear(); }).find("--model DIR is required"),
            std::string::npos);
  EXPECT_NE(with([&](auto& b) { b.model = (dir_ / "nope").string(); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(with([](auto& b) { b.kv_transport = "pigeon"; }).find("--kv-transport"),
            std::string::npos);
  EXPECT_NE(with([](auto& b) { b.num_requests = 0; }).find("--num-requests"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.prompt_len = 0; }).find("--prompt-len"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.output_len = 0; }).find("--output-len"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.decode_threads = -1; }).find("--decode-threads"),
            std::string::npos);
  EXPECT_NE(with([](auto& b) { b.kv_cache_mb = 0; }).find("--kv-cache-mb"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.kv_cache_dtype = "int3"; }), "accepted");
  EXPECT_NE(with([](auto& b) { b.request_timeout_s = 0; }).find("timeouts"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.memcpy_reps = 0; }).find("--memcpy-reps"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.target_ratio = -1; }).find("--target-ratio"), std::string::npos);
  EXPECT_NE(with([&](auto& b) { b.log_dir = "/proc/no/such/place"; }).find("--log-dir"),
            std::string::npos);
}

// A result as a run of 2 measured requests would leave it: transfers of 2 and 3 ms against
// memcpys of `memcpy_best_s` and more.
PdBenchResult result_with(double memcpy_best_s) {
  PdBenchResult r;
  r.num_cores = 2;
  r.load_at_start = "0.10 0.20 0.30";
  r.load_at_end = "0.40 0.50 0.60";
  r.num_bytes = 4u << 20;
  PdRequestFigures warmup;
  warmup.is_warmup = true;
  warmup.client_ttft_s = 9;  // must not count
  warmup.transfer_s = 9;
  r.figures.push_back(warmup);
  for (double transfer_s : {0.002, 0.003}) {
    PdRequestFigures f;
    f.client_ttft_s = 0.1;
    f.wait_s = 0.08;
    f.transfer_s = transfer_s;
    f.num_bytes = 4u << 20;
    r.figures.push_back(f);
  }
  for (CopyKind kind : kCopyKinds) {
    r.copy_s[kind] = {memcpy_best_s, memcpy_best_s * 2};
  }
  return r;
}

std::string report_text(const PdBenchOptions& o, const PdBenchResult& r) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&buf, &size);
  print_pd_report(o, r, out);
  std::fclose(out);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

TEST(PdReportTest, TheVerdictComparesBestsOnShm) {
  PdBenchOptions o;
  std::string pass = report_text(o, result_with(0.0015));  // 2 ms / 1.5 ms = 1.33
  EXPECT_NE(pass.find("transfer / memcpy: 1.33 (bests)"), std::string::npos) << pass;
  EXPECT_NE(pass.find("target (bests) <= 2.0: PASS"), std::string::npos) << pass;
  std::string miss = report_text(o, result_with(0.0005));  // 2 ms / 0.5 ms = 4
  EXPECT_NE(miss.find("target (bests) <= 2.0: MISS"), std::string::npos) << miss;
  o.kv_transport = "tcp";
  std::string tcp = report_text(o, result_with(0.0005));
  EXPECT_NE(tcp.find("(the target <= 2.0 is for shm)"), std::string::npos) << tcp;
}

TEST(PdReportTest, TheWarmupIsListedButNotCounted) {
  PdBenchOptions o;
  o.num_requests = 2;
  PdBenchResult r = result_with(0.001);
  std::string text = report_text(o, r);
  EXPECT_NE(text.find("warm-up"), std::string::npos);
  EXPECT_NE(text.find("#2"), std::string::npos);
  // Mean client TTFT 100 ms; wait 80 ms of it.
  EXPECT_NE(text.find("client TTFT"), std::string::npos);
  EXPECT_NE(text.find("100.00"), std::string::npos) << text;
  EXPECT_NE(text.find("80.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("load average: 0.10 0.20 0.30 at start, 0.40 0.50 0.60 at end (2 cores)"),
            std::string::npos)
      << text;

  nlohmann::ordered_json j = pd_report_json(o, r);
  EXPECT_EQ(j["requests"].size(), 3u);
  EXPECT_TRUE(j["requests"][0]["warmup"].get<bool>());
  EXPECT_DOUBLE_EQ(j["summary_seconds"]["client_ttft_s"]["mean"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["summary_seconds"]["transfer_s"]["median"].get<double>(), 0.0025);
  const auto& copy = j["transfer_vs_memcpy"];
  EXPECT_DOUBLE_EQ(copy["ratio_best"].get<double>(), 2.0);
  EXPECT_TRUE(copy["pass"].get<bool>());
  EXPECT_TRUE(copy["target_applies"].get<bool>());
  EXPECT_EQ(copy["num_bytes"].get<uint64_t>(), 4u << 20);
  EXPECT_EQ(copy["second_mapping_dst"]["samples"].size(), 2u);
}

TEST(PdReportTest, RequestLabels) {
  EXPECT_EQ(pd_request_label(true, 0), "warm-up");
  EXPECT_EQ(pd_request_label(false, 12), "#12");
}

}  // namespace
}  // namespace crescent::bench
