#include "bootstrap/worker_registry.h"

#include <gtest/gtest.h>

namespace crescent::bootstrap {
namespace {

WorkerRegistration reg(std::string id, int dp, int tp, int pp, std::string addr) {
  return WorkerRegistration{std::move(id), dp, tp, pp, std::move(addr)};
}

TEST(WorkerRegistry, UnavailableListingMissingRanksUntilAllRegistered) {
  WorkerRegistry registry(3);
  auto before = registry.snapshot();
  ASSERT_FALSE(before.is_ok());
  EXPECT_EQ(before.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(before.status().message().find("dp rank(s) 0, 1, 2"), std::string::npos)
      << before.status().message();
  ASSERT_TRUE(registry.add(reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  ASSERT_TRUE(registry.add(reg("c", 2, 0, 0, "tcp://h:3")).is_ok());
  auto partial = registry.snapshot();
  ASSERT_FALSE(partial.is_ok());
  EXPECT_NE(partial.status().message().find("dp rank(s) 1 to register (2 of 3 registered)"),
            std::string::npos)
      << partial.status().message();
  ASSERT_TRUE(registry.add(reg("b", 1, 0, 0, "tcp://h:2")).is_ok());
  ASSERT_TRUE(registry.add(reg("b", 1, 1, 0, "tcp://h:4")).is_ok());
  auto all = registry.snapshot();
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->size(), 3u);
  EXPECT_EQ(all->at(1).engine_id, "b");
  EXPECT_EQ(all->at(1).worker_addr.at(1).at(0), "tcp://h:4");
  EXPECT_EQ(registry.num_workers(), 4);
}

TEST(WorkerRegistry, IdenticalReRegistrationIsOk) {
  WorkerRegistry registry(1);
  ASSERT_TRUE(registry.add(reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  EXPECT_TRUE(registry.add(reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  EXPECT_EQ(registry.num_workers(), 1);
}

TEST(WorkerRegistry, ConflictsNameBothValues) {
  WorkerRegistry registry(2);
  ASSERT_TRUE(registry.add(reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  ASSERT_TRUE(registry.add(reg("b", 1, 0, 0, "tcp://h:2")).is_ok());

  Status other_engine = registry.add(reg("x", 0, 1, 0, "tcp://h:9"));
  EXPECT_EQ(other_engine.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_engine.message(), "dp_rank 0 is registered by engine_id 'a', not 'x'");

  Status other_dp = registry.add(reg("a", 1, 0, 0, "tcp://h:2"));
  EXPECT_EQ(other_dp.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_dp.message(), "engine_id 'a' is registered at dp_rank 0, not dp_rank 1");

  Status other_addr = registry.add(reg("a", 0, 0, 0, "tcp://h:5"));
  EXPECT_EQ(other_addr.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_addr.message(),
            "dp_rank 0 tp_rank 0 pp_rank 0 is registered at tcp://h:1, not tcp://h:5");
  EXPECT_EQ(registry.num_workers(), 2);
}

TEST(WorkerRegistry, DpRankBeyondExpectedIsInvalid) {
  WorkerRegistry registry(2);
  Status s = registry.add(reg("a", 2, 0, 0, "tcp://h:1"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dp_rank 2 is outside 0..1"), std::string::npos) << s.message();
}

TEST(WorkerRegistry, EncodersAreKeptApartFromTheDpRanks) {
  WorkerRegistry registry(1);
  WorkerRegistration enc = reg("encode-1", 0, 0, 0, "tcp://h:9");
  enc.role = "encode";
  ASSERT_TRUE(registry.add(enc).is_ok());
  ASSERT_TRUE(registry.add(enc).is_ok());  // identical again
  // An encoder neither takes dp rank 0 nor counts toward the expected ranks.
  EXPECT_EQ(registry.snapshot().status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(registry.add(reg("prefill-1", 0, 0, 0, "tcp://h:1")).is_ok());
  auto table = registry.snapshot();
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  EXPECT_EQ(table->at(0).engine_id, "prefill-1");
  EXPECT_EQ(registry.encoders(), (EncoderTable{{"encode-1", "tcp://h:9"}}));

  // The same encoder elsewhere, or an engine id used as both kinds, conflicts.
  WorkerRegistration moved = enc;
  moved.addr = "tcp://h:10";
  Status s = registry.add(moved);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("tcp://h:9"), std::string::npos) << s.message();
  WorkerRegistration as_encoder = reg("prefill-1", 0, 0, 0, "tcp://h:11");
  as_encoder.role = "encode";
  EXPECT_EQ(registry.add(as_encoder).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.add(reg("encode-1", 0, 1, 0, "tcp://h:12")).code(),
            StatusCode::kAlreadyExists);
  // Encoders may be many, whatever the expected dp ranks.
  WorkerRegistration second = reg("encode-2", 5, 0, 0, "tcp://h:13");
  second.role = "encode";
  EXPECT_TRUE(registry.add(second).is_ok());
  EXPECT_EQ(registry.encoders().size(), 2u);
}

}  // namespace
}  // namespace crescent::bootstrap
