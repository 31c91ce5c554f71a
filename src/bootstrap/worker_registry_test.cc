#include "bootstrap/worker_registry.h"

#include <gtest/gtest.h>

#include <set>

namespace crescent::bootstrap {
namespace {

WorkerRegistration reg(std::string id, int dp, int tp, int pp, std::string addr) {
  return WorkerRegistration{std::move(id), dp, tp, pp, std::move(addr)};
}

Status add_to(WorkerRegistry& registry, const WorkerRegistration& r) {
  auto added = registry.add(r);
  return added.is_ok() ? Status::ok() : added.status();
}

TEST(WorkerRegistry, UnavailableListingMissingRanksUntilAllRegistered) {
  WorkerRegistry registry(3);
  auto before = registry.snapshot();
  ASSERT_FALSE(before.is_ok());
  EXPECT_EQ(before.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(before.status().message().find("dp rank(s) 0, 1, 2"), std::string::npos)
      << before.status().message();
  ASSERT_TRUE(add_to(registry, reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  ASSERT_TRUE(add_to(registry, reg("c", 2, 0, 0, "tcp://h:3")).is_ok());
  auto partial = registry.snapshot();
  ASSERT_FALSE(partial.is_ok());
  EXPECT_NE(partial.status().message().find("dp rank(s) 1 to register (2 of 3 registered)"),
            std::string::npos)
      << partial.status().message();
  ASSERT_TRUE(add_to(registry, reg("b", 1, 0, 0, "tcp://h:2")).is_ok());
  ASSERT_TRUE(add_to(registry, reg("b", 1, 1, 0, "tcp://h:4")).is_ok());
  auto all = registry.snapshot();
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->size(), 3u);
  EXPECT_EQ(all->at(1).engine_id, "b");
  EXPECT_EQ(all->at(1).worker_addr.at(1).at(0), "tcp://h:4");
  EXPECT_EQ(registry.num_workers(), 4);
}

TEST(WorkerRegistry, IdenticalReRegistrationIsOk) {
  WorkerRegistry registry(1);
  ASSERT_TRUE(add_to(registry, reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  EXPECT_TRUE(add_to(registry, reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  EXPECT_EQ(registry.num_workers(), 1);
}

TEST(WorkerRegistry, ConflictsNameBothValues) {
  WorkerRegistry registry(2);
  ASSERT_TRUE(add_to(registry, reg("a", 0, 0, 0, "tcp://h:1")).is_ok());
  ASSERT_TRUE(add_to(registry, reg("b", 1, 0, 0, "tcp://h:2")).is_ok());

  Status other_engine = add_to(registry, reg("x", 0, 1, 0, "tcp://h:9"));
  EXPECT_EQ(other_engine.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_engine.message(),
            "dp_rank 0 is registered by engine_id 'a', not 'x' (it holds no lease)");

  Status other_dp = add_to(registry, reg("a", 1, 0, 0, "tcp://h:2"));
  EXPECT_EQ(other_dp.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_dp.message(), "engine_id 'a' is registered at dp_rank 0, not dp_rank 1");

  Status other_addr = add_to(registry, reg("a", 0, 0, 0, "tcp://h:5"));
  EXPECT_EQ(other_addr.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(other_addr.message(),
            "dp_rank 0 tp_rank 0 pp_rank 0 is registered at tcp://h:1, not tcp://h:5");
  EXPECT_EQ(registry.num_workers(), 2);
}

TEST(WorkerRegistry, DpRankBeyondExpectedIsInvalid) {
  WorkerRegistry registry(2);
  Status s = add_to(registry, reg("a", 2, 0, 0, "tcp://h:1"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dp_rank 2 is outside 0..1"), std::string::npos) << s.message();
}

TEST(WorkerRegistry, EncodersAreKeptApartFromTheDpRanks) {
  WorkerRegistry registry(1);
  WorkerRegistration enc = reg("encode-1", 0, 0, 0, "tcp://h:9");
  enc.role = "encode";
  ASSERT_TRUE(add_to(registry, enc).is_ok());
  ASSERT_TRUE(add_to(registry, enc).is_ok());  // identical again
  // An encoder neither takes dp rank 0 nor counts toward the expected ranks.
  EXPECT_EQ(registry.snapshot().status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(add_to(registry, reg("prefill-1", 0, 0, 0, "tcp://h:1")).is_ok());
  auto table = registry.snapshot();
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  EXPECT_EQ(table->at(0).engine_id, "prefill-1");
  EXPECT_EQ(registry.encoders(), (EncoderTable{{"encode-1", "tcp://h:9"}}));

  // The same encoder elsewhere, or an engine id used as both kinds, conflicts.
  WorkerRegistration moved = enc;
  moved.addr = "tcp://h:10";
  Status s = add_to(registry, moved);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("tcp://h:9"), std::string::npos) << s.message();
  WorkerRegistration as_encoder = reg("prefill-1", 0, 0, 0, "tcp://h:11");
  as_encoder.role = "encode";
  EXPECT_EQ(add_to(registry, as_encoder).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(add_to(registry, reg("encode-1", 0, 1, 0, "tcp://h:12")).code(),
            StatusCode::kAlreadyExists);
  // Encoders may be many, whatever the expected dp ranks.
  WorkerRegistration second = reg("encode-2", 5, 0, 0, "tcp://h:13");
  second.role = "encode";
  EXPECT_TRUE(add_to(registry, second).is_ok());
  EXPECT_EQ(registry.encoders().size(), 2u);
}

// Leases on a fake clock, and a probe that answers for the addresses in `alive`.
class LeaseTest : public ::testing::Test {
 protected:
  WorkerRegistry make(int expected_dp_ranks = 1, double max_ttl_s = 10) {
    WorkerRegistryOptions o;
    o.expected_dp_ranks = expected_dp_ranks;
    o.max_lease_ttl_s = max_ttl_s;
    o.now = [this] { return now_; };
    o.is_alive = [this](const std::string& addr) {
      ++num_probes_;
      return alive_.count(addr) != 0;
    };
    return WorkerRegistry(std::move(o));
  }
  static WorkerRegistration leased(std::string id, int dp, std::string addr, double ttl_s) {
    WorkerRegistration r = reg(std::move(id), dp, 0, 0, std::move(addr));
    r.lease_ttl_s = ttl_s;
    return r;
  }
  void advance_ms(int64_t ms) { now_ += std::chrono::milliseconds(ms); }

  TimePoint now_ = Clock::now();
  std::set<std::string> alive_;
  int num_probes_ = 0;
};

TEST_F(LeaseTest, ALapsedLeaseIsRemovedAndRenewalKeepsIt) {
  WorkerRegistry registry = make();
  alive_ = {"tcp://h:1"};
  auto first = registry.add(leased("a", 0, "tcp://h:1", 2));
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->epoch, 1u);
  EXPECT_EQ(first->lease_ttl_s, 2);
  EXPECT_FALSE(first->is_renewal);
  for (int i = 0; i < 5; ++i) {
    advance_ms(1500);
    auto renewed = registry.add(leased("a", 0, "tcp://h:1", 2));
    ASSERT_TRUE(renewed.is_ok()) << renewed.status().to_string();
    EXPECT_TRUE(renewed->is_renewal);
    EXPECT_EQ(renewed->epoch, 1u);
  }
  ASSERT_TRUE(registry.snapshot().is_ok());
  advance_ms(1999);
  ASSERT_TRUE(registry.snapshot().is_ok());
  advance_ms(1);
  auto gone = registry.snapshot();
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(registry.num_workers(), 0);
  // The same engine may come back (a long pause, not a replacement): a new epoch.
  auto back = registry.add(leased("a", 0, "tcp://h:1", 2));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->epoch, 2u);
}

TEST_F(LeaseTest, TheGrantIsCappedAndNoLeaseNeverExpires) {
  WorkerRegistry registry = make(2, 5);
  auto capped = registry.add(leased("a", 0, "tcp://h:1", 60));
  ASSERT_TRUE(capped.is_ok());
  EXPECT_EQ(capped->lease_ttl_s, 5);
  auto vllm = registry.add(reg("v", 1, 0, 0, "tcp://h:2"));  // no lease_ttl_s
  ASSERT_TRUE(vllm.is_ok());
  EXPECT_EQ(vllm->lease_ttl_s, 0);
  advance_ms(24 * 3600 * 1000);
  auto table = registry.add(leased("a", 0, "tcp://h:1", 60));  // a is back after expiring
  ASSERT_TRUE(table.is_ok());
  auto all = registry.snapshot();
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->at(1).engine_id, "v");
}

TEST_F(LeaseTest, ANewcomerReplacesAnOwnerThatDoesNotAnswerAndFencesIt) {
  WorkerRegistry registry = make();
  ASSERT_TRUE(registry.add(leased("old", 0, "tcp://h:1", 10)).is_ok());
  // "old" was killed: nothing answers at tcp://h:1, long before its lease would lapse.
  advance_ms(100);
  auto replaced = registry.add(leased("new", 0, "tcp://h:2", 10));
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  EXPECT_EQ(replaced->epoch, 2u);
  EXPECT_EQ(num_probes_, 1);
  auto table = registry.snapshot();
  ASSERT_TRUE(table.is_ok());
  EXPECT_EQ(table->at(0).engine_id, "new");
  EXPECT_EQ(table->at(0).epoch, 2u);
  EXPECT_EQ(table->at(0).worker_addr.at(0).at(0), "tcp://h:2");
  EXPECT_EQ(registry.num_workers(), 1);
  // The old owner's renewal is refused naming the new owner and the epoch.
  auto fenced = registry.add(leased("old", 0, "tcp://h:1", 10));
  EXPECT_EQ(fenced.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fenced.status().message(),
            "engine_id 'old' was fenced: dp_rank 0 was taken over by engine_id 'new' at epoch 2");
  // Even once the new owner is gone too.
  advance_ms(20'000);
  EXPECT_EQ(registry.add(leased("old", 0, "tcp://h:1", 10)).status().code(),
            StatusCode::kFailedPrecondition);
}

// Years of restarts: every one fences its predecessor, and the fences stay bounded.
TEST_F(LeaseTest, FencesAreBoundedAndTheOldestIsForgotten) {
  auto engine = [](int i) {
    std::string id = std::to_string(i);
    return id.insert(0, 1, 'e');  // not "e" + ...: GCC 12's -Wrestrict misfires on it
  };
  WorkerRegistry registry = make();
  const int num_restarts = static_cast<int>(WorkerRegistry::kMaxFences) + 10;
  for (int i = 0; i <= num_restarts; ++i) {
    // Each engine registers the address its predecessor had, as a restart on one port does.
    auto r = registry.add(leased(engine(i), 0, "tcp://h:1", 10));
    ASSERT_TRUE(r.is_ok()) << i << ": " << r.status().to_string();
  }
  EXPECT_EQ(registry.num_fences(), WorkerRegistry::kMaxFences);
  // The newest fences hold; the owner is untouched.
  EXPECT_EQ(registry.add(leased(engine(num_restarts - 1), 0, "tcp://h:9", 10)).status().code(),
            StatusCode::kFailedPrecondition);
  // The oldest was forgotten: it is no longer fenced, but cannot take the live owner's rank.
  alive_ = {"tcp://h:1"};
  auto forgotten = registry.add(leased("e0", 0, "tcp://h:9", 10));
  EXPECT_EQ(forgotten.status().code(), StatusCode::kAlreadyExists)
      << forgotten.status().to_string();
  auto table = registry.snapshot();
  ASSERT_TRUE(table.is_ok());
  EXPECT_EQ(table->at(0).engine_id, engine(num_restarts));
}

TEST_F(LeaseTest, ALiveOwnerIsKeptAndTheNewcomerRefusedNamingBoth) {
  WorkerRegistry registry = make();
  alive_ = {"tcp://h:1"};
  ASSERT_TRUE(registry.add(leased("old", 0, "tcp://h:1", 10)).is_ok());
  advance_ms(2500);
  auto refused = registry.add(leased("new", 0, "tcp://h:2", 10));
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(refused.status().message(),
            "dp_rank 0 is registered by engine_id 'old', not 'new' (its lease runs 7.5 s more "
            "and tcp://h:1 answers)");
  // Once the live owner's lease lapses (it stopped renewing), the newcomer gets the rank.
  advance_ms(7500);
  auto taken = registry.add(leased("new", 0, "tcp://h:2", 10));
  ASSERT_TRUE(taken.is_ok()) << taken.status().to_string();
  EXPECT_EQ(taken->epoch, 2u);
  // The lapsed owner (it was frozen, say) is fenced when it renews.
  auto old_again = registry.add(leased("old", 0, "tcp://h:1", 10));
  EXPECT_EQ(old_again.status().code(), StatusCode::kFailedPrecondition)
      << old_again.status().to_string();
}

TEST_F(LeaseTest, RegisteringTheOwnersAddressReplacesWithoutAProbe) {
  WorkerRegistry registry = make();
  alive_ = {"tcp://h:1"};  // the newcomer itself now listens there
  ASSERT_TRUE(registry.add(reg("old", 0, 0, 0, "tcp://h:1")).is_ok());
  auto replaced = registry.add(reg("new", 0, 0, 0, "tcp://h:1"));
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  EXPECT_EQ(replaced->epoch, 2u);
  EXPECT_EQ(num_probes_, 0);
}

TEST_F(LeaseTest, EncoderLeasesLapse) {
  WorkerRegistry registry = make();
  WorkerRegistration enc = leased("encode-1", 0, "tcp://h:9", 1);
  enc.role = "encode";
  WorkerRegistration forever = reg("encode-2", 0, 0, 0, "tcp://h:8");
  forever.role = "encode";
  ASSERT_TRUE(registry.add(enc).is_ok());
  ASSERT_TRUE(registry.add(forever).is_ok());
  advance_ms(900);
  ASSERT_TRUE(registry.add(enc).is_ok());  // renewed
  advance_ms(900);
  EXPECT_EQ(registry.encoders().size(), 2u);
  advance_ms(200);
  EXPECT_EQ(registry.encoders(), (EncoderTable{{"encode-2", "tcp://h:8"}}));
  EXPECT_EQ(registry.num_workers(), 1);
}

}  // namespace
}  // namespace crescent::bootstrap
