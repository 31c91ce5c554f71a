// LeaseKeeper against a real BootstrapServer on 127.0.0.1, with sub-second leases.

#include "bootstrap/lease_keeper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bootstrap/bootstrap_server.h"
#include "net/socket.h"

namespace crescent::bootstrap {
namespace {

Deadline soon() {
  return Deadline::after_ms(10'000);
}

std::unique_ptr<BootstrapServer> start_server() {
  BootstrapServerOptions options;
  options.port = 0;
  auto server = BootstrapServer::start(options);
  CRESCENT_CHECK(server.is_ok()) << server.status().to_string();
  return std::move(server).value();
}

// An address something answers at, for as long as the returned listener lives.
std::string live_addr(net::Fd* listener) {
  auto fd = net::listen_tcp("127.0.0.1", 0);
  CRESCENT_CHECK(fd.is_ok());
  *listener = std::move(*fd);
  return "tcp://127.0.0.1:" + std::to_string(*net::local_port(*listener));
}

// An address nothing answers at (bound, then closed).
std::string dead_addr() {
  net::Fd listener;
  return live_addr(&listener);
}

TEST(LeaseKeeper, RenewalsKeepTheEntryAndItLapsesAfterStop) {
  auto server = start_server();
  net::Fd listener;
  WorkerRegistration r{"a", 0, 0, 0, live_addr(&listener)};
  r.lease_ttl_s = 0.6;
  ASSERT_TRUE(register_worker(server->url(), r, soon()).is_ok());
  LeaseKeeper keeper(server->url(), r, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto table = query(server->url(), soon());
  ASSERT_TRUE(table.is_ok()) << "renewed every 200 ms, the lease should hold: "
                             << table.status().to_string();
  EXPECT_EQ(table->at(0).engine_id, "a");
  EXPECT_EQ(table->at(0).epoch, 1u);
  EXPECT_GE(keeper.num_renewals(), 4);
  keeper.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  EXPECT_EQ(query(server->url(), soon()).status().code(), StatusCode::kUnavailable)
      << "the lease should have lapsed once renewals stopped";
}

TEST(LeaseKeeper, AReplacedOwnerIsToldItWasFenced) {
  auto server = start_server();
  WorkerRegistration old_owner{"old", 0, 0, 0, dead_addr()};
  old_owner.lease_ttl_s = 0.6;
  ASSERT_TRUE(register_worker(server->url(), old_owner, soon()).is_ok());
  std::atomic<int> num_fenced{0};
  std::string reason;
  LeaseKeeper keeper(server->url(), old_owner, [&](const std::string& why) {
    reason = why;
    ++num_fenced;
  });
  // The newcomer: old's address does not answer, so it takes dp rank 0 at once.
  net::Fd listener;
  WorkerRegistration newcomer{"new", 0, 0, 0, live_addr(&listener)};
  newcomer.lease_ttl_s = 0.6;
  ASSERT_TRUE(register_worker(server->url(), newcomer, soon()).is_ok());
  auto deadline = Deadline::after_ms(3000);
  while (num_fenced == 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(num_fenced, 1);
  EXPECT_TRUE(keeper.is_fenced());
  EXPECT_NE(reason.find("taken over by engine_id 'new' at epoch 2"), std::string::npos) << reason;
  // Its plain registration is a conflict for register_worker.
  EXPECT_EQ(register_worker(server->url(), old_owner, soon()).code(), StatusCode::kAlreadyExists);
  auto table = query(server->url(), soon());
  ASSERT_TRUE(table.is_ok());
  EXPECT_EQ(table->at(0).engine_id, "new");
  EXPECT_EQ(table->at(0).epoch, 2u);
}

TEST(LeaseKeeper, KeepsTryingWhileTheBootstrapIsDownAndReRegistersWithANewOne) {
  // A bootstrap that restarts (standalone, on the same port) gets the registration back.
  auto first = start_server();
  const int port = first->port();
  net::Fd listener;
  WorkerRegistration r{"a", 0, 0, 0, live_addr(&listener)};
  r.lease_ttl_s = 0.6;
  const std::string url = first->url();
  ASSERT_TRUE(register_worker(url, r, soon()).is_ok());
  LeaseKeeper keeper(url, r, nullptr);
  first.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  BootstrapServerOptions options;
  options.port = port;
  auto second = BootstrapServer::start(options);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  auto deadline = Deadline::after_ms(3000);
  Result<QueryResult> table = unavailable("not queried");
  while (!(table = query(url, soon())).is_ok() && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  EXPECT_EQ(table->at(0).engine_id, "a");
  EXPECT_FALSE(keeper.is_fenced());
}

}  // namespace
}  // namespace crescent::bootstrap
