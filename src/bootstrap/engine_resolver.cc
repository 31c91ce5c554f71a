// EngineResolver: a cache with single-flight queries. The first resolve() of a (url, engine)
// sends the query outside the lock; later callers wait on its Flight instead of sending their
// own, so a burst of requests for a new engine costs the bootstrap server one query.

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "bootstrap/bootstrap_client.h"

namespace crescent::bootstrap {
namespace {

// (normalized "host:port", engine id)
using Key = std::pair<std::string, std::string>;

struct Flight {
  bool is_done = false;
  std::optional<Result<std::string>> result;
};

// The tp 0 / pp 0 address of engine_id in a /query table.
Result<std::string> pick(const QueryResult& table, const std::string& url,
                         const std::string& engine_id) {
  std::string known;
  for (const auto& [dp, entry] : table) {
    if (entry.engine_id == engine_id) {
      auto tp = entry.worker_addr.find(0);
      if (tp != entry.worker_addr.end()) {
        auto pp = tp->second.find(0);
        if (pp != tp->second.end()) {
          return pp->second;
        }
      }
      return unavailable("engine_id '" + engine_id + "' at bootstrap " + url + " (dp_rank " +
                         std::to_string(dp) + ") has no tp_rank 0 / pp_rank 0 worker yet");
    }
    known += (known.empty() ? "'" : ", '") + entry.engine_id + "'";
  }
  return not_found("engine_id '" + engine_id + "' is not registered at bootstrap " + url +
                   " (registered: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace

struct EngineResolver::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, std::string> cache;                // GUARDED_BY(mu)
  std::map<Key, std::shared_ptr<Flight>> flights;  // GUARDED_BY(mu)
  std::atomic<int64_t> num_queries{0};

  // Waits for flight to finish or the deadline; false on the deadline.
  bool wait(std::unique_lock<std::mutex>& lock, const Flight& flight, Deadline deadline) {
    auto is_done = [&] { return flight.is_done; };
    if (deadline.when() == TimePoint::max()) {
      cv.wait(lock, is_done);
      return true;
    }
    return cv.wait_until(lock, deadline.when(), is_done);
  }
};

EngineResolver::EngineResolver() : impl_(std::make_unique<Impl>()) {}
EngineResolver::~EngineResolver() = default;

Result<std::string> EngineResolver::resolve(const std::string& url, const std::string& engine_id,
                                            Deadline deadline) {
  if (engine_id.empty()) {
    return invalid_argument("resolve: empty engine_id");
  }
  ASSIGN_OR_RETURN(auto host_port, parse_http_url(url));
  const Key key{host_port.first + ":" + std::to_string(host_port.second), engine_id};
  std::unique_lock<std::mutex> lock(impl_->mu);
  while (true) {
    if (auto hit = impl_->cache.find(key); hit != impl_->cache.end()) {
      return hit->second;
    }
    if (auto it = impl_->flights.find(key); it != impl_->flights.end()) {
      std::shared_ptr<Flight> flight = it->second;
      if (!impl_->wait(lock, *flight, deadline)) {
        return deadline_exceeded("resolving engine_id '" + engine_id + "' at bootstrap " + url +
                                 ": the query in flight did not finish in time");
      }
      const Result<std::string>& result = *flight->result;
      // The leader's shorter deadline is not ours: try again while we have time.
      if (result.status().code() == StatusCode::kDeadlineExceeded && !deadline.is_expired()) {
        continue;
      }
      return result;
    }
    auto flight = std::make_shared<Flight>();
    impl_->flights[key] = flight;
    lock.unlock();
    impl_->num_queries.fetch_add(1, std::memory_order_relaxed);
    auto table = query(url, deadline);
    Result<std::string> result = table.is_ok() ? pick(*table, url, engine_id)
                                               : Result<std::string>(table.status().with_context(
                                                     "resolving engine_id '" + engine_id + "'"));
    lock.lock();
    if (table.is_ok()) {
      // Every engine in the answer is as fresh as the one asked for.
      for (const auto& [dp, entry] : *table) {
        auto tp = entry.worker_addr.find(0);
        if (tp != entry.worker_addr.end() && tp->second.count(0) != 0) {
          impl_->cache[Key{key.first, entry.engine_id}] = tp->second.at(0);
        }
      }
    }
    flight->is_done = true;
    flight->result = result;
    impl_->flights.erase(key);
    impl_->cv.notify_all();
    return result;
  }
}

void EngineResolver::invalidate(const std::string& url, const std::string& engine_id) {
  auto host_port = parse_http_url(url);
  if (!host_port.is_ok()) {
    return;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cache.erase(Key{host_port->first + ":" + std::to_string(host_port->second), engine_id});
}

int64_t EngineResolver::num_queries() const {
  return impl_->num_queries.load(std::memory_order_relaxed);
}

}  // namespace crescent::bootstrap
