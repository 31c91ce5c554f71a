#include "bench/disagg/ec_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "transfer/transfer_engine.h"

namespace crescent::bench {
namespace {

std::string refusal(const EcBenchOptions& o) {
  Status s = validate_ec_bench_options(o);
  return s.is_ok() ? "accepted" : s.message();
}

TEST(EcBenchOptionsTest, RefusesEachBadOptionByItsFlag) {
  EcBenchOptions o;
  EXPECT_EQ(refusal(o), "accepted");
  auto with = [&](auto change) {
    EcBenchOptions bad = o;
    change(bad);
    return refusal(bad);
  };
  EXPECT_NE(with([](auto& b) { b.ec_transport = "pigeon"; }).find("--ec-transport"),
            std::string::npos);
  EXPECT_NE(with([](auto& b) { b.hidden_size = 0; }).find("--hidden-size"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.num_images = 0; }).find("--num-images"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.num_warmup = -1; }).find("--warmup"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.target_ratio = 0; }).find("--target-ratio"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.tokens = "16,x"; }).find("--tokens expects"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.tokens = "16,,32"; }).find("--tokens expects"), std::string::npos);
  EXPECT_NE(with([](auto& b) { b.tokens = ""; }).find("--tokens is empty"), std::string::npos);
}

TEST(EcBenchOptionsTest, ParsesTokenCounts) {
  auto t = parse_ec_bench_tokens("256,1196");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(*t, (std::vector<int64_t>{256, 1196}));
  EXPECT_FALSE(parse_ec_bench_tokens("0").is_ok());
  EXPECT_FALSE(parse_ec_bench_tokens("-3").is_ok());
}

// The whole benchmark, small: a producer and a consumer over each transport this build has,
// every float checked, the JSON written with one row per shape.
class EcBenchRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EcBenchRunTest, MovesEveryImageAndWritesTheFigures) {
  auto kind = transfer::parse_transport(GetParam());
  ASSERT_TRUE(kind.is_ok());
  if (!transfer::is_transport_available(*kind)) {
    // The refusal is the behaviour under test in a build without it.
    EcBenchOptions o;
    o.ec_transport = GetParam();
    Status s = run_ec_bench(o);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("not available"), std::string::npos) << s.to_string();
    return;
  }
  std::filesystem::path json =
      std::filesystem::temp_directory_path() /
      ("crescent-ec-bench-test-" + std::to_string(::getpid()) + "-" + GetParam() + ".json");
  EcBenchOptions o;
  o.ec_transport = GetParam();
  o.tokens = "4,33";
  o.hidden_size = 64;
  o.num_images = 3;
  o.num_warmup = 1;
  o.json_path = json.string();
  ASSERT_TRUE(validate_ec_bench_options(o).is_ok());
  Status s = run_ec_bench(o);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::ifstream in(json);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove(json);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["mode"], "encode");
  EXPECT_EQ(j["ec_transport"], GetParam());
  EXPECT_EQ(j["target_applies"].get<bool>(), GetParam() == "shm");
  ASSERT_EQ(j["shapes"].size(), 2u);
  EXPECT_EQ(j["shapes"][1]["num_tokens"].get<int64_t>(), 33);
  EXPECT_EQ(j["shapes"][1]["num_bytes"].get<uint64_t>(), uint64_t{33} * 64 * sizeof(float));
  EXPECT_EQ(j["shapes"][1]["fetch_seconds"]["samples"].size(), 3u);
  EXPECT_EQ(j["shapes"][1]["warmup_fetch_seconds"].size(), 1u);
  EXPECT_GT(j["shapes"][1]["ratio_median"].get<double>(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, EcBenchRunTest, ::testing::Values("shm", "tcp", "ucx"));

}  // namespace
}  // namespace crescent::bench
