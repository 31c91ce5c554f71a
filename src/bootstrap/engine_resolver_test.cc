// EngineResolver against the real bootstrap server, and against a slow fake /query (a plain
// HTTP server) to make collapsing and deadlines observable.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap_client.h"
#include "bootstrap/bootstrap_server.h"
#include "bootstrap/wire.h"
#include "net/http/http_server.h"
#include "net/socket.h"

namespace crescent::bootstrap {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

Deadline soon() {
  return Deadline::after_ms(10'000);
}

std::unique_ptr<BootstrapServer> start_server(int expected_dp_ranks) {
  BootstrapServerOptions options;
  options.port = 0;
  options.expected_dp_ranks = expected_dp_ranks;
  auto server = BootstrapServer::start(options);
  CRESCENT_CHECK(server.is_ok()) << server.status().to_string();
  return std::move(server).value();
}

// Answers GET /query with `table` after `delay`, from its own thread (handlers must not block
// the I/O thread), and counts the queries it got.
class SlowQueryServer {
 public:
  SlowQueryServer(QueryResult table, milliseconds delay) : table_(std::move(table)) {
    auto server = net::http::Server::start(
        {}, [this, delay](net::http::Request, std::shared_ptr<net::http::ResponseWriter> w) {
          num_queries_.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu_);
          threads_.emplace_back([this, w, delay] {
            std::this_thread::sleep_for(delay);
            w->send(200, "application/json", query_json(table_));
          });
        });
    CRESCENT_CHECK(server.is_ok()) << server.status().to_string();
    server_ = std::move(server).value();
  }
  ~SlowQueryServer() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : threads_) {
      t.join();
    }
    server_->stop();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  int num_queries() const { return num_queries_.load(); }

 private:
  QueryResult table_;
  std::unique_ptr<net::http::Server> server_;
  std::atomic<int> num_queries_{0};
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

QueryResult one_engine(const std::string& id, const std::string& addr) {
  QueryResult table;
  table[0].engine_id = id;
  table[0].worker_addr[0][0] = addr;
  return table;
}

TEST(EngineResolver, ResolvesTp0Pp0AndCachesTheAnswer) {
  auto server = start_server(2);
  ASSERT_TRUE(
      register_worker(server->url(), {"p0", 0, 1, 0, "tcp://127.0.0.1:7001"}, soon()).is_ok());
  ASSERT_TRUE(
      register_worker(server->url(), {"p0", 0, 0, 0, "tcp://127.0.0.1:7000"}, soon()).is_ok());
  ASSERT_TRUE(
      register_worker(server->url(), {"p1", 1, 0, 0, "tcp://127.0.0.1:7100"}, soon()).is_ok());
  EngineResolver resolver;
  auto a = resolver.resolve(server->url(), "p0", soon());
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(*a, "tcp://127.0.0.1:7000");
  EXPECT_EQ(resolver.num_queries(), 1);
  // Cached: the same id (also spelled with a trailing slash) and the other engine of the
  // same answer cost no query.
  EXPECT_EQ(*resolver.resolve(server->url() + "/", "p0", soon()), "tcp://127.0.0.1:7000");
  EXPECT_EQ(*resolver.resolve(server->url(), "p1", soon()), "tcp://127.0.0.1:7100");
  EXPECT_EQ(resolver.num_queries(), 1);
  resolver.invalidate(server->url(), "p0");
  EXPECT_EQ(*resolver.resolve(server->url(), "p0", soon()), "tcp://127.0.0.1:7000");
  EXPECT_EQ(resolver.num_queries(), 2);
}

TEST(EngineResolver, NotFoundNamesTheEngineAndTheUrl) {
  auto server = start_server(1);
  ASSERT_TRUE(
      register_worker(server->url(), {"p0", 0, 0, 0, "tcp://127.0.0.1:7000"}, soon()).is_ok());
  EngineResolver resolver;
  auto r = resolver.resolve(server->url(), "ghost", soon());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "engine_id 'ghost' is not registered at bootstrap " +
                                      server->url() + " (registered: 'p0')");
  // Failures are not cached.
  EXPECT_FALSE(resolver.resolve(server->url(), "ghost", soon()).is_ok());
  EXPECT_EQ(resolver.num_queries(), 2);
}

TEST(EngineResolver, NotReadyIsUnavailableAndNotCached) {
  auto server = start_server(2);
  ASSERT_TRUE(
      register_worker(server->url(), {"p0", 0, 0, 0, "tcp://127.0.0.1:7000"}, soon()).is_ok());
  EngineResolver resolver;
  auto r = resolver.resolve(server->url(), "p0", soon());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("dp rank(s) 1"), std::string::npos) << r.status().message();
  ASSERT_TRUE(
      register_worker(server->url(), {"p1", 1, 0, 0, "tcp://127.0.0.1:7100"}, soon()).is_ok());
  EXPECT_TRUE(resolver.resolve(server->url(), "p0", soon()).is_ok());
}

TEST(EngineResolver, ClosedPortIsUnavailableWithinTheDeadline) {
  int port = 0;
  {
    auto fd = net::listen_tcp("127.0.0.1", 0);
    ASSERT_TRUE(fd.is_ok());
    port = *net::local_port(*fd);
  }
  EngineResolver resolver;
  auto t0 = SteadyClock::now();
  auto r =
      resolver.resolve("http://127.0.0.1:" + std::to_string(port), "p0", Deadline::after_ms(2000));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  EXPECT_NE(r.status().message().find("resolving engine_id 'p0'"), std::string::npos);
  EXPECT_LT(SteadyClock::now() - t0, milliseconds(2000));
}

TEST(EngineResolver, SixteenConcurrentResolvesSendOneQuery) {
  SlowQueryServer fake(one_engine("p0", "tcp://10.0.0.1:7000"), milliseconds(300));
  EngineResolver resolver;
  std::atomic<int> num_ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      auto r = resolver.resolve(fake.url(), "p0", soon());
      if (r.is_ok() && *r == "tcp://10.0.0.1:7000") {
        num_ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_ok.load(), 16);
  EXPECT_EQ(resolver.num_queries(), 1);
  EXPECT_EQ(fake.num_queries(), 1);
}

TEST(EngineResolver, WaitersShareTheLeadersFailure) {
  SlowQueryServer fake(one_engine("p0", "tcp://10.0.0.1:7000"), milliseconds(300));
  EngineResolver resolver;
  std::atomic<int> num_not_found{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = resolver.resolve(fake.url(), "ghost", soon());
      if (r.status().code() == StatusCode::kNotFound) {
        num_not_found.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_not_found.load(), 8);
  EXPECT_EQ(fake.num_queries(), 1);
}

TEST(EngineResolver, AWaiterKeepsItsOwnDeadline) {
  SlowQueryServer fake(one_engine("p0", "tcp://10.0.0.1:7000"), milliseconds(800));
  EngineResolver resolver;
  std::thread leader([&] { EXPECT_TRUE(resolver.resolve(fake.url(), "p0", soon()).is_ok()); });
  while (fake.num_queries() == 0) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  auto t0 = SteadyClock::now();
  auto r = resolver.resolve(fake.url(), "p0", Deadline::after_ms(100));
  auto elapsed = SteadyClock::now() - t0;
  leader.join();
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().to_string();
  EXPECT_GE(elapsed, milliseconds(90));
  EXPECT_LT(elapsed, milliseconds(600));
  EXPECT_EQ(fake.num_queries(), 1);
}

TEST(EngineResolver, RefusesBadInput) {
  EngineResolver resolver;
  EXPECT_EQ(resolver.resolve("localhost:8998", "p0", soon()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(resolver.resolve("http://127.0.0.1:8998", "", soon()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(resolver.num_queries(), 0);
}

TEST(EngineResolver, ResolvesEncodersApartAndCachesThem) {
  auto server = start_server(1);
  WorkerRegistration enc;
  enc.engine_id = "encode-1";
  enc.addr = "tcp://127.0.0.1:7400";
  enc.role = std::string(kEncodeRole);
  ASSERT_TRUE(register_worker(server->url(), enc, soon()).is_ok());
  EngineResolver resolver;
  // No dp rank yet: the encoder resolves all the same (its query never waits for ranks).
  auto addr = resolver.resolve_encoder(server->url(), "encode-1", soon());
  ASSERT_TRUE(addr.is_ok()) << addr.status().to_string();
  EXPECT_EQ(*addr, "tcp://127.0.0.1:7400");
  EXPECT_TRUE(resolver.resolve_encoder(server->url(), "encode-1", soon()).is_ok());
  EXPECT_EQ(resolver.num_queries(), 1);
  // Not a dp engine.
  EXPECT_FALSE(resolver.resolve(server->url(), "encode-1", Deadline::after_ms(500)).is_ok());
  auto missing = resolver.resolve_encoder(server->url(), "encode-9", soon());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("encode-1"), std::string::npos)
      << missing.status().to_string();
  resolver.invalidate_encoder(server->url(), "encode-1");
  const int64_t before = resolver.num_queries();
  EXPECT_TRUE(resolver.resolve_encoder(server->url(), "encode-1", soon()).is_ok());
  EXPECT_EQ(resolver.num_queries(), before + 1);
}

}  // namespace
}  // namespace crescent::bootstrap
