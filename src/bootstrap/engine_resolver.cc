// EngineResolver: a cache with single-flight queries. The first resolve() of a (url, engine)
// sends the query outside the lock; later callers wait on its Flight instead of sending their
// own, so a burst of requests for a new engine costs the bootstrap server one query.

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap_client.h"
#include "bootstrap/etcd_registry.h"

namespace crescent::bootstrap {
namespace {

// (normalized "host:port" + ("" or "#encode"), engine id): encoders are cached apart.
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

Result<std::string> pick_encoder(const EncoderTable& table, const std::string& url,
                                 const std::string& engine_id) {
  if (auto it = table.find(engine_id); it != table.end()) {
    return it->second;
  }
  std::string known;
  for (const auto& [id, addr] : table) {
    known += (known.empty() ? "'" : ", '") + id + "'";
  }
  return not_found("encoder '" + engine_id + "' is not registered at bootstrap " + url +
                   " (encoders registered: " + (known.empty() ? "none" : known) + ")");
}

// One query: the answer for engine_id, and every (engine id, addr) the answer held.
struct Answer {
  Result<std::string> result;
  std::vector<std::pair<std::string, std::string>> all;
};

Answer ask(const std::string& url, const std::string& engine_id, bool is_encoder,
           Deadline deadline) {
  Answer answer{Result<std::string>(unavailable("unset")), {}};
  if (is_encoder) {
    auto table = query_encoders(url, deadline);
    if (!table.is_ok()) {
      answer.result = table.status().with_context("resolving encoder '" + engine_id + "'");
      return answer;
    }
    answer.result = pick_encoder(*table, url, engine_id);
    answer.all.assign(table->begin(), table->end());
    return answer;
  }
  auto table = query(url, deadline);
  if (!table.is_ok()) {
    answer.result = table.status().with_context("resolving engine_id '" + engine_id + "'");
    return answer;
  }
  answer.result = pick(*table, url, engine_id);
  for (const auto& [dp, entry] : *table) {
    auto tp = entry.worker_addr.find(0);
    if (tp != entry.worker_addr.end() && tp->second.count(0) != 0) {
      answer.all.emplace_back(entry.engine_id, tp->second.at(0));
    }
  }
  return answer;
}

}  // namespace

struct EngineResolver::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, std::string> cache;                // GUARDED_BY(mu)
  std::map<Key, std::shared_ptr<Flight>> flights;  // GUARDED_BY(mu)
  std::atomic<int64_t> num_queries{0};

  Result<std::string> resolve(const std::string& url, const std::string& engine_id, bool is_encoder,
                              Deadline deadline);
  void invalidate(const std::string& url, const std::string& engine_id, bool is_encoder);

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
  return impl_->resolve(url, engine_id, /*is_encoder=*/false, deadline);
}

Result<std::string> EngineResolver::resolve_encoder(const std::string& url,
                                                    const std::string& engine_id,
                                                    Deadline deadline) {
  return impl_->resolve(url, engine_id, /*is_encoder=*/true, deadline);
}

Result<std::string> EngineResolver::Impl::resolve(const std::string& url,
                                                  const std::string& engine_id, bool is_encoder,
                                                  Deadline deadline) {
  if (engine_id.empty()) {
    return invalid_argument("resolve: empty engine_id");
  }
  ASSIGN_OR_RETURN(std::string url_key, bootstrap_url_key(url));
  const Key key{url_key + (is_encoder ? "#encode" : ""), engine_id};
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    if (auto hit = cache.find(key); hit != cache.end()) {
      return hit->second;
    }
    if (auto it = flights.find(key); it != flights.end()) {
      std::shared_ptr<Flight> flight = it->second;
      if (!wait(lock, *flight, deadline)) {
        return deadline_exceeded("resolving " + std::string(is_encoder ? "encoder" : "engine_id") +
                                 " '" + engine_id + "' at bootstrap " + url +
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
    flights[key] = flight;
    lock.unlock();
    num_queries.fetch_add(1, std::memory_order_relaxed);
    Answer answer = ask(url, engine_id, is_encoder, deadline);
    lock.lock();
    // Every engine in the answer is as fresh as the one asked for.
    for (const auto& [id, addr] : answer.all) {
      cache[Key{key.first, id}] = addr;
    }
    flight->is_done = true;
    flight->result = answer.result;
    flights.erase(key);
    cv.notify_all();
    return answer.result;
  }
}

void EngineResolver::invalidate(const std::string& url, const std::string& engine_id) {
  impl_->invalidate(url, engine_id, /*is_encoder=*/false);
}

void EngineResolver::invalidate_encoder(const std::string& url, const std::string& engine_id) {
  impl_->invalidate(url, engine_id, /*is_encoder=*/true);
}

void EngineResolver::Impl::invalidate(const std::string& url, const std::string& engine_id,
                                      bool is_encoder) {
  auto url_key = bootstrap_url_key(url);
  if (!url_key.is_ok()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.erase(Key{*url_key + (is_encoder ? "#encode" : ""), engine_id});
}

int64_t EngineResolver::num_queries() const {
  return impl_->num_queries.load(std::memory_order_relaxed);
}

}  // namespace crescent::bootstrap
