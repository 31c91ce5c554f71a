// The etcd client and the registry over etcd keys, against a real etcd started by the test
// (tools/etcd/etcd: these tests fail, never skip, when it is missing).

#include "bootstrap/etcd_registry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "bootstrap/etcd_client.h"
#include "bootstrap/etcd_members.h"
#include "bootstrap/lease_keeper.h"
#include "net/socket.h"
#include "tests/testing/etcd_process.h"

namespace crescent::bootstrap {
namespace {

Deadline soon() {
  return Deadline::after_ms(10'000);
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = crescent::testing::EtcdProcess::start();
    ASSERT_TRUE(etcd.is_ok()) << etcd.status().to_string();
    etcd_ = std::move(etcd).value();
  }

  EtcdClient client() { return EtcdClient("127.0.0.1", etcd_->client_port()); }

  WorkerRegistration worker(const std::string& engine_id, int dp, double ttl_s = 2) {
    WorkerRegistration r;
    r.engine_id = engine_id;
    r.dp_rank = dp;
    r.addr = "tcp://127.0.0.1:" + std::to_string(17000 + dp);
    r.lease_ttl_s = ttl_s;
    return r;
  }

  std::unique_ptr<crescent::testing::EtcdProcess> etcd_;
};

// An address something answers at, for as long as *listener lives.
std::string live_addr(net::Fd* listener) {
  auto fd = net::listen_tcp("127.0.0.1", 0);
  CRESCENT_CHECK(fd.is_ok());
  *listener = std::move(*fd);
  return "tcp://127.0.0.1:" + std::to_string(*net::local_port(*listener));
}

// A port nothing listens on.
int dead_port() {
  auto fd = net::listen_tcp("127.0.0.1", 0);
  CRESCENT_CHECK(fd.is_ok());
  return *net::local_port(*fd);
}

TEST(EtcdUrlTest, ParsesHostPortAndPrefix) {
  auto u = parse_etcd_url("etcd://10.0.0.1:2379/prod/llm/");
  ASSERT_TRUE(u.is_ok()) << u.status().to_string();
  EXPECT_EQ(u->host, "10.0.0.1");
  EXPECT_EQ(u->port, 2379);
  EXPECT_EQ(u->prefix, "/prod/llm");
  auto d = parse_etcd_url("etcd://etcd-1:2379");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->prefix, "/crescent");
  EXPECT_FALSE(parse_etcd_url("http://h:1").is_ok());
  EXPECT_FALSE(parse_etcd_url("etcd://h").is_ok());
  EXPECT_FALSE(parse_etcd_url("etcd://h:99999/p").is_ok());
  EXPECT_FALSE(parse_etcd_url("etcd://h:1/a b").is_ok());
  EXPECT_TRUE(check_bootstrap_url("http://h:1").is_ok());
  EXPECT_TRUE(check_bootstrap_url("etcd://h:1/x").is_ok());
  EXPECT_FALSE(check_bootstrap_url("grpc://h:1").is_ok());
  EXPECT_EQ(*bootstrap_url_key("etcd://h:1/x/"), "etcd://h:1/x");
  EXPECT_EQ(*bootstrap_url_key("http://h:1/"), "h:1");
}

TEST(EtcdClientDownTest, UnreachableIsUnavailable) {
  EtcdClient client("127.0.0.1", dead_port());
  auto lease = client.grant_lease(5, soon());
  ASSERT_FALSE(lease.is_ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable) << lease.status().to_string();
  auto table = query("etcd://127.0.0.1:" + std::to_string(dead_port()), soon());
  ASSERT_FALSE(table.is_ok());
  EXPECT_EQ(table.status().code(), StatusCode::kUnavailable) << table.status().to_string();
}

TEST_F(EtcdTest, KvAndLeases) {
  EtcdClient c = client();
  auto lease = c.grant_lease(30, soon());
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  ASSERT_TRUE(c.put("/t/a", "1", *lease, soon()).is_ok());
  ASSERT_TRUE(c.put("/t/b", "2", 0, soon()).is_ok());
  ASSERT_TRUE(c.put("/u/c", "3", 0, soon()).is_ok());
  auto range = c.range_prefix("/t/", soon());
  ASSERT_TRUE(range.is_ok()) << range.status().to_string();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "/t/a");
  EXPECT_EQ(range->kvs[0].value, "1");
  EXPECT_EQ(range->kvs[0].lease, *lease);
  EXPECT_EQ(range->kvs[1].value, "2");
  EXPECT_GT(range->revision, 0);

  auto created = c.create_if_absent("/t/new", {{"/t/new", "x"}, {"/t/side", "y"}}, *lease, soon());
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  EXPECT_TRUE(created->created);
  auto again = c.create_if_absent("/t/new", {{"/t/new", "z"}}, 0, soon());
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->existing.value, "x");
  EXPECT_EQ(again->existing.create_revision, created->revision);

  auto ttl = c.keep_alive(*lease, soon());
  ASSERT_TRUE(ttl.is_ok()) << ttl.status().to_string();
  EXPECT_GT(*ttl, 0);
  ASSERT_TRUE(c.revoke_lease(*lease, soon()).is_ok());
  // Revoking deletes every key under the lease.
  auto gone = c.get("/t/a", soon());
  ASSERT_TRUE(gone.is_ok());
  EXPECT_FALSE(gone->has_value());
  EXPECT_FALSE(c.get("/t/side", soon())->has_value());
  auto dead = c.keep_alive(*lease, soon());
  ASSERT_FALSE(dead.is_ok());
  EXPECT_EQ(dead.status().code(), StatusCode::kNotFound) << dead.status().to_string();

  auto deleted = c.delete_key("/t/b", soon());
  ASSERT_TRUE(deleted.is_ok());
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(*c.delete_key("/t/b", soon()), 0);
}

TEST_F(EtcdTest, RegisterQueryRenewAndConflict) {
  const std::string url = etcd_->url("/reg");
  net::Fd p1_listener;
  WorkerRegistration p1 = worker("p1", 0, 30);
  p1.addr = live_addr(&p1_listener);  // p1 is alive: it answers at its address
  ASSERT_TRUE(register_worker(url, p1, soon()).is_ok());
  ASSERT_TRUE(register_worker(url, worker("p1b", 1, 30), soon()).is_ok());
  auto table = query(url, soon());
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  ASSERT_EQ(table->size(), 2u);
  EXPECT_EQ(table->at(0).engine_id, "p1");
  EXPECT_GT(table->at(0).epoch, 0u);
  EXPECT_EQ(table->at(0).worker_addr.at(0).at(0), p1.addr);
  EXPECT_EQ(table->at(1).engine_id, "p1b");

  auto renewed = renew_registration(url, p1, soon());
  ASSERT_TRUE(renewed.is_ok()) << renewed.status().to_string();
  EXPECT_FALSE(renewed->is_fenced);
  EXPECT_TRUE(renewed->granted.is_renewal);
  EXPECT_EQ(renewed->granted.epoch, table->at(0).epoch);
  EXPECT_GT(renewed->granted.lease_ttl_s, 0);

  // A live owner is never overwritten: another engine waits (Unavailable, retried).
  Status conflict = register_worker(url, worker("p2", 0, 30), soon());
  EXPECT_EQ(conflict.code(), StatusCode::kUnavailable) << conflict.to_string();
  EXPECT_NE(conflict.message().find("p1"), std::string::npos) << conflict.to_string();
  EXPECT_EQ(query(url, soon())->at(0).engine_id, "p1");

  // Another prefix is another deployment.
  auto other = query(etcd_->url("/other"), soon());
  ASSERT_TRUE(other.is_ok());
  EXPECT_TRUE(other->empty());

  EngineResolver resolver;
  auto addr = resolver.resolve(url, "p1b", soon());
  ASSERT_TRUE(addr.is_ok()) << addr.status().to_string();
  EXPECT_EQ(*addr, "tcp://127.0.0.1:17001");
  auto missing = resolver.resolve(url, "nope", soon());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(EtcdTest, SilentOwnerExpiresAndIsReplacedWithAHigherEpoch) {
  const std::string url = etcd_->url("/crash");
  // "old" still answers at its address (frozen, its sockets open) but renews nothing: the
  // replacement retries until its lease runs out.
  net::Fd old_listener;
  WorkerRegistration old_reg = worker("old", 0, 2);
  old_reg.addr = live_addr(&old_listener);
  ASSERT_TRUE(register_worker(url, old_reg, soon()).is_ok());
  uint64_t old_epoch = query(url, soon())->at(0).epoch;
  auto start = std::chrono::steady_clock::now();
  Status s = register_with_retry(url, worker("new", 0, 2), Deadline::after_ms(20'000));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_GT(waited, 0.5);          // it did wait for the lease
  EXPECT_LT(waited, 2 * 2 + 1.0);  // within 2x the ttl (etcd checks expiry every 500 ms)
  auto table = query(url, soon());
  ASSERT_TRUE(table.is_ok());
  EXPECT_EQ(table->at(0).engine_id, "new");
  EXPECT_GT(table->at(0).epoch, old_epoch);
  // The old engine, back, is fenced.
  auto renewed = renew_registration(url, old_reg, soon());
  ASSERT_TRUE(renewed.is_ok()) << renewed.status().to_string();
  EXPECT_TRUE(renewed->is_fenced);
  EXPECT_NE(renewed->fenced_reason.find("'new'"), std::string::npos) << renewed->fenced_reason;
}

TEST_F(EtcdTest, OwnerThatRefusesConnectionsIsReplacedAtOnce) {
  const std::string url = etcd_->url("/dead");
  WorkerRegistration old_reg = worker("old", 0, 30);
  old_reg.addr = "tcp://127.0.0.1:" + std::to_string(dead_port());  // killed with -9
  ASSERT_TRUE(register_worker(url, old_reg, soon()).is_ok());
  uint64_t old_epoch = query(url, soon())->at(0).epoch;
  auto start = std::chrono::steady_clock::now();
  Status s = register_worker(url, worker("new", 0, 30), soon());
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_LT(waited, 1.0);  // not the 30 s lease
  auto table = query(url, soon());
  EXPECT_EQ(table->at(0).engine_id, "new");
  EXPECT_GT(table->at(0).epoch, old_epoch);
  EXPECT_TRUE(renew_registration(url, old_reg, soon())->is_fenced);
}

TEST_F(EtcdTest, LeaseKeeperKeepsTheRegistrationPastItsTtl) {
  const std::string url = etcd_->url("/keep");
  WorkerRegistration r = worker("kept", 0, 2);
  ASSERT_TRUE(register_worker(url, r, soon()).is_ok());
  {
    LeaseKeeper keeper(url, r, [](const std::string&) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
    EXPECT_GE(keeper.num_renewals(), 3);
    EXPECT_FALSE(keeper.is_fenced());
    EXPECT_EQ(query(url, soon())->at(0).engine_id, "kept");
  }
  // Without the keeper the key expires by itself.
  auto deadline = Deadline::after_ms(6000);
  while (!query(url, soon())->empty() && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(query(url, soon())->empty());
}

TEST_F(EtcdTest, EncodersRegisterAndResolve) {
  const std::string url = etcd_->url();
  WorkerRegistration e = worker("enc-1", 0, 30);
  e.role = std::string(kEncodeRole);
  e.addr = "tcp://127.0.0.1:18001";
  ASSERT_TRUE(register_worker(url, e, soon()).is_ok());
  auto renewed = renew_registration(url, e, soon());
  ASSERT_TRUE(renewed.is_ok());
  EXPECT_TRUE(renewed->granted.is_renewal);
  auto table = query_encoders(url, soon());
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  ASSERT_EQ(table->size(), 1u);
  EXPECT_EQ(table->at("enc-1"), "tcp://127.0.0.1:18001");
  EXPECT_TRUE(query(url, soon())->empty());  // encoders are not dp ranks
  EngineResolver resolver;
  EXPECT_EQ(*resolver.resolve_encoder(url, "enc-1", soon()), "tcp://127.0.0.1:18001");
}

TEST_F(EtcdTest, EtcdDownIsUnavailable) {
  const std::string url = etcd_->url("/down");
  ASSERT_TRUE(register_worker(url, worker("w", 0, 30), soon()).is_ok());
  etcd_->kill_now();
  auto renewed = renew_registration(url, worker("w", 0, 30), Deadline::after_ms(2000));
  ASSERT_FALSE(renewed.is_ok());
  EXPECT_TRUE(renewed.status().code() == StatusCode::kUnavailable ||
              renewed.status().code() == StatusCode::kDeadlineExceeded)
      << renewed.status().to_string();
}

TEST_F(EtcdTest, RenewalAfterTheLeaseLapsedRecreatesTheKeys) {
  const std::string url = etcd_->url("/lapse");
  WorkerRegistration r = worker("w", 0, 30);
  ASSERT_TRUE(register_worker(url, r, soon()).is_ok());
  auto before = query(url, soon());
  ASSERT_TRUE(before.is_ok());
  // The lease ran out while etcd was out of reach (revoked here: the same for the keys).
  auto owner = client().get("/lapse/engines/0/owner", soon());
  ASSERT_TRUE(owner.is_ok() && owner->has_value());
  ASSERT_TRUE(client().revoke_lease((*owner)->lease, soon()).is_ok());
  EXPECT_TRUE(query(url, soon())->empty());
  auto renewed = renew_registration(url, r, soon());
  ASSERT_TRUE(renewed.is_ok()) << renewed.status().to_string();
  EXPECT_FALSE(renewed->is_fenced);
  EXPECT_FALSE(renewed->granted.is_renewal);
  auto after = query(url, soon());
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->at(0).engine_id, "w");
  EXPECT_GT(after->at(0).epoch, before->at(0).epoch);
}

TEST_F(EtcdTest, BadRegistrationsAreRefused) {
  const std::string url = etcd_->url();
  WorkerRegistration r = worker("a/b", 0);
  EXPECT_EQ(register_worker(url, r, soon()).code(), StatusCode::kInvalidArgument);
  r = worker("ok", 0);
  r.addr = "http://x:1";
  EXPECT_EQ(register_worker(url, r, soon()).code(), StatusCode::kInvalidArgument);
  r = worker("ok", 0);
  r.role = "decode";
  EXPECT_EQ(register_worker(url, r, soon()).code(), StatusCode::kInvalidArgument);
  // Junk under the prefix is DataLoss naming the key, not a crash.
  ASSERT_TRUE(client().put("/crescent/engines/x/owner", "e", 0, soon()).is_ok());
  auto table = query(url, soon());
  ASSERT_FALSE(table.is_ok());
  EXPECT_EQ(table.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(table.status().message().find("/crescent/engines/x/owner"), std::string::npos);
}

TEST_F(EtcdTest, MembersArePublishedRenewedAndRevoked) {
  const std::string cluster = etcd_->url("/c");
  ClusterMember d{
      .url = "http://127.0.0.1:8020", .role = "decode", .bootstrap = "", .engine_id = "decode-1"};
  ClusterMember p{.url = "http://127.0.0.1:8010",
                  .role = "prefill",
                  .bootstrap = "etcd://127.0.0.1:2379/p0",
                  .engine_id = "prefill-1"};
  auto pd = MemberPublisher::start(cluster, d, 1);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  auto pp = MemberPublisher::start(cluster, p, 1);
  ASSERT_TRUE(pp.is_ok()) << pp.status().to_string();
  // A value another writer broke is skipped and named; the others stay readable.
  ASSERT_TRUE(client().put("/c/members/decode/broken", "{", 0, soon()).is_ok());
  // Past the 1 s ttl: kept alive.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto list = read_cluster_members(cluster, soon());
  ASSERT_TRUE(list.is_ok()) << list.status().to_string();
  ASSERT_EQ(list->members.size(), 2u);
  EXPECT_EQ(list->members[0], d);  // key order: decode before prefill
  EXPECT_EQ(list->members[1], p);
  ASSERT_EQ(list->skipped.size(), 1u);
  EXPECT_NE(list->skipped[0].find("/c/members/decode/broken"), std::string::npos);
  EXPECT_GE((*pd)->num_renewals(), 2);
  // stop() revokes: the member is gone at once, not after the ttl.
  (*pd)->stop();
  list = read_cluster_members(cluster, soon());
  ASSERT_TRUE(list.is_ok()) << list.status().to_string();
  ASSERT_EQ(list->members.size(), 1u);
  EXPECT_EQ(list->members[0].engine_id, "prefill-1");
  EXPECT_FALSE(MemberPublisher::start("http://127.0.0.1:1", d, 1).is_ok());
  ClusterMember bad = d;
  bad.role = "boss";
  EXPECT_FALSE(MemberPublisher::start(cluster, bad, 1).is_ok());
}

TEST_F(EtcdTest, AMemberWhoseLeaseLapsedIsPublishedAgain) {
  const std::string cluster = etcd_->url("/c");
  ClusterMember d{
      .url = "http://127.0.0.1:8020", .role = "decode", .bootstrap = "", .engine_id = "decode-1"};
  auto pub = MemberPublisher::start(cluster, d, 3);
  ASSERT_TRUE(pub.is_ok()) << pub.status().to_string();
  // As if etcd had lost the lease (restored from a backup, or unreachable past the ttl).
  auto key = client().get("/c/members/decode/decode-1", soon());
  ASSERT_TRUE(key.is_ok() && key->has_value());
  ASSERT_TRUE(client().revoke_lease((*key)->lease, soon()).is_ok());
  auto deadline = Deadline::after_ms(5000);
  bool back = false;
  while (!back && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto list = read_cluster_members(cluster, soon());
    back = list.is_ok() && list->members.size() == 1;
  }
  EXPECT_TRUE(back) << "the member was not published again within 5 s (renewals every 1 s)";
}

}  // namespace
}  // namespace crescent::bootstrap
