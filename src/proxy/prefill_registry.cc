#include "proxy/prefill_registry.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "bootstrap/bootstrap_client.h"
#include "core/clock.h"
#include "core/logging.h"
#include "net/http/http_client.h"

namespace crescent::proxy {
namespace {

constexpr int64_t kCallTimeoutMs = 2000;

std::string short_text(std::string_view body) {
  constexpr size_t kMax = 200;
  std::string out(body.substr(0, kMax));
  if (body.size() > kMax) {
    out += "...";
  }
  return out;
}

// Engine ids by dp rank from the prefill's keys in etcd (bootstrap/etcd_registry.h).
Result<std::vector<std::string>> etcd_engine_ids(const std::string& url) {
  ASSIGN_OR_RETURN(bootstrap::QueryResult table,
                   bootstrap::query(url, Deadline::after_ms(kCallTimeoutMs)));
  std::vector<std::string> ids;
  for (const auto& [rank, entry] : table) {
    if (rank != static_cast<int>(ids.size())) {
      return unavailable("dp rank " + std::to_string(ids.size()) + " is not registered");
    }
    ids.push_back(entry.engine_id);
  }
  if (ids.empty()) {
    return unavailable("no dp rank is registered");
  }
  return ids;
}

}  // namespace

Result<std::vector<std::string>> parse_bootstrap_query(std::string_view body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return invalid_argument("the bootstrap /query answer is not a JSON object: " +
                            short_text(body));
  }
  if (j.empty()) {
    return invalid_argument("the bootstrap /query answer lists no dp rank");
  }
  std::map<int, std::string> by_rank;
  for (const auto& [key, entry] : j.items()) {
    int rank = -1;
    auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), rank);
    if (key.empty() || ec != std::errc() || ptr != key.data() + key.size() || rank < 0) {
      return invalid_argument("the bootstrap /query answer has a key '" + key +
                              "' that is not a dp rank");
    }
    if (!entry.is_object() || !entry.contains("engine_id") || !entry["engine_id"].is_string() ||
        entry["engine_id"].get<std::string>().empty()) {
      return invalid_argument("dp rank " + key +
                              " of the bootstrap /query answer has no engine_id string");
    }
    by_rank[rank] = entry["engine_id"].get<std::string>();
  }
  std::vector<std::string> ids;
  for (const auto& [rank, id] : by_rank) {
    if (rank != static_cast<int>(ids.size())) {
      return invalid_argument("the bootstrap /query answer misses dp rank " +
                              std::to_string(ids.size()) + " (ranks must be 0.." +
                              std::to_string(by_rank.size() - 1) + ")");
    }
    ids.push_back(id);
  }
  return ids;
}

PrefillRegistry::PrefillRegistry(std::vector<PrefillSpec> prefills, int64_t poll_interval_ms,
                                 int64_t refresh_interval_ms)
    : poll_interval_ms_(poll_interval_ms), refresh_interval_ms_(refresh_interval_ms) {
  for (auto& spec : prefills) {
    Entry e;
    e.waiting_for = "prefill " + spec.server.url + " (not polled yet)";
    e.spec = std::move(spec);
    entries_.push_back(std::move(e));
  }
}

PrefillRegistry::~PrefillRegistry() {
  stop();
}

void PrefillRegistry::start() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].is_member) {
      start_poller_locked(static_cast<int>(i));
    }
  }
}

void PrefillRegistry::start_poller_locked(int index) {
  Entry& e = entries_[static_cast<size_t>(index)];
  if (!started_ || stopping_ || e.has_poller) {
    return;
  }
  e.has_poller = true;
  threads_.resize(entries_.size());
  std::thread& slot = threads_[static_cast<size_t>(index)];
  if (slot.joinable()) {
    // A poller that ended when its prefill left: past its last use of mu_ (has_poller was
    // cleared under it), so this join returns at once.
    slot.join();
  }
  slot = std::thread([this, index] { poll_loop(index); });
}

void PrefillRegistry::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) {
    if (t.joinable()) {
      t.join();
    }
  }
}

int PrefillRegistry::add(PrefillSpec spec) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string bootstrap = spec.bootstrap_addr();
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.spec.server.url == spec.server.url && e.spec.bootstrap_addr() == bootstrap) {
      if (!e.is_member) {
        e.is_member = true;
        e.is_ready = false;
        e.is_up = false;
        e.engine_ids.clear();
        e.waiting_for = "prefill " + e.spec.server.url + " (not polled yet)";
        // Its old poller may still be asleep (remove() woke it, but it may not have run yet):
        // it polls at once instead of after a whole refresh interval.
        e.is_poll_requested = true;
        start_poller_locked(static_cast<int>(i));
        cv_.notify_all();
      }
      return static_cast<int>(i);
    }
  }
  Entry e;
  e.waiting_for = "prefill " + spec.server.url + " (not polled yet)";
  e.spec = std::move(spec);
  e.is_discovered = true;
  entries_.push_back(std::move(e));
  const int index = static_cast<int>(entries_.size() - 1);
  start_poller_locked(index);
  return index;
}

void PrefillRegistry::remove(int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_.at(static_cast<size_t>(index));
    if (!e.is_member) {
      return;
    }
    e.is_member = false;
    if (on_lost_) {
      on_lost_(index);
    }
    rebuild_table_locked();
  }
  cv_.notify_all();  // its poller wakes and ends
}

std::optional<int> PrefillRegistry::find(const PrefillSpec& spec) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string bootstrap = spec.bootstrap_addr();
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].spec.server.url == spec.server.url &&
        entries_[i].spec.bootstrap_addr() == bootstrap) {
      return static_cast<int>(i);
    }
  }
  return std::nullopt;
}

PrefillSpec PrefillRegistry::spec(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.at(static_cast<size_t>(index)).spec;
}

bool PrefillRegistry::sleep_ms(int index, int64_t ms) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  // By index each time: add() may grow entries_ while this waits.
  auto entry = [&]() -> Entry& { return entries_[static_cast<size_t>(index)]; };
  auto is_gone = [&] { return stopping_ || !entry().is_member; };
  cv_.wait_until(lock, start + std::chrono::milliseconds(std::min(ms, kMinRequestedPollGapMs)),
                 is_gone);
  cv_.wait_until(lock, start + std::chrono::milliseconds(ms),
                 [&] { return is_gone() || entry().is_poll_requested; });
  entry().is_poll_requested = false;
  return !stopping_;
}

void PrefillRegistry::poll_soon(int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_.at(static_cast<size_t>(index));
    if (!e.is_member || e.is_poll_requested) {
      return;
    }
    e.is_poll_requested = true;
  }
  cv_.notify_all();
}

void PrefillRegistry::poll_loop(int index) {
  PrefillSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = entries_[static_cast<size_t>(index)].spec;
  }
  const std::string bootstrap = spec.bootstrap_addr();
  net::http::HttpClient server(spec.server.host, spec.server.port);
  net::http::HttpClient bootstrap_client(spec.server.host, spec.bootstrap_port);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = entries_[static_cast<size_t>(index)];
      if (!e.is_member) {  // left the cluster (remove)
        e.has_poller = false;
        return;
      }
    }
    // Why this poll failed ("" if it did not), else the engine ids it read.
    std::string failure;
    std::vector<std::string> ids;
    auto health = server.request("GET", "/health", "", {}, Deadline::after_ms(kCallTimeoutMs));
    if (!health.is_ok()) {
      failure = "prefill " + spec.server.url + " (/health: " + health.status().message() + ")";
    } else if (health->status != 200) {
      failure = "prefill " + spec.server.url + " (/health answers " +
                std::to_string(health->status) + ")";
    }
    if (failure.empty() && !spec.etcd_url.empty()) {
      auto parsed = etcd_engine_ids(spec.etcd_url);
      if (!parsed.is_ok()) {
        failure = "the etcd registrations " + spec.etcd_url + " of prefill " + spec.server.url +
                  " (" + parsed.status().message() + ")";
      } else {
        ids = std::move(parsed).value();
      }
    } else if (failure.empty()) {
      auto query =
          bootstrap_client.request("GET", "/query", "", {}, Deadline::after_ms(kCallTimeoutMs));
      std::string where = "the bootstrap server " + bootstrap + " of prefill " + spec.server.url;
      if (!query.is_ok()) {
        failure = where + " (/query: " + query.status().message() + ")";
      } else if (query->status != 200) {
        failure = where + " (/query answers " + std::to_string(query->status) + ": " +
                  short_text(query->body) + ")";
      } else {
        auto parsed = parse_bootstrap_query(query->body);
        if (!parsed.is_ok()) {
          failure = where + " (" + parsed.status().message() + ")";
        } else {
          ids = std::move(parsed).value();
        }
      }
    }
    bool is_ready = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = entries_[static_cast<size_t>(index)];
      if (!e.is_member) {
        e.has_poller = false;
        return;
      }
      bool changed = false;
      if (failure.empty()) {
        if (!e.is_ready) {
          CRESCENT_LOG(kInfo) << "proxy: prefill " << spec.server.url << " is ready, dp_size "
                              << ids.size() << " (bootstrap " << bootstrap << ")";
        } else if (ids != e.engine_ids) {
          CRESCENT_LOG(kInfo) << "proxy: prefill " << spec.server.url
                              << " has new engine ids, dp_size " << ids.size();
        } else if (!e.is_up) {
          CRESCENT_LOG(kInfo) << "proxy: prefill " << spec.server.url << " is up again";
        }
        changed = !e.is_ready || !e.is_up || ids != e.engine_ids;
        if (e.is_ready && ids != e.engine_ids && on_lost_) {
          on_lost_(index);  // restarted: what it held is gone
        }
        e.is_ready = true;
        e.is_up = true;
        e.engine_ids = std::move(ids);
        e.waiting_for.clear();
      } else {
        if (e.waiting_for != failure && e.is_ready) {
          CRESCENT_LOG(kWarn) << "proxy: prefill is down: " << failure;
        } else if (e.waiting_for != failure) {
          CRESCENT_LOG(kInfo) << "proxy: waiting for " << failure;
        }
        changed = e.is_up;
        if (e.is_up && on_lost_) {
          on_lost_(index);
        }
        e.is_up = false;
        e.waiting_for = failure;
      }
      if (changed) {
        rebuild_table_locked();
      }
      is_ready = e.is_ready;
    }
    if (!sleep_ms(index, is_ready ? refresh_interval_ms_ : poll_interval_ms_)) {
      return;  // stopping: has_poller stays set, so nothing starts another
    }
  }
}

void PrefillRegistry::rebuild_table_locked() {
  table_.clear();
  is_ready_ = true;
  bool any_up = false;
  bool any_ready = false;
  for (const auto& e : entries_) {
    if (!e.is_member) {
      continue;
    }
    is_ready_ = is_ready_ && (e.is_ready || e.is_discovered);
    any_ready = any_ready || e.is_ready;
    any_up = any_up || e.is_up;
  }
  is_ready_ = is_ready_ && any_ready;
  if (!is_ready_) {
    return;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.is_member || !e.is_ready || (any_up && !e.is_up)) {
      continue;
    }
    for (size_t rank = 0; rank < e.engine_ids.size(); ++rank) {
      PrefillPick pick;
      pick.prefill_index = static_cast<int>(i);
      pick.source.dp_rank = static_cast<int>(rank);
      pick.source.engine_id = e.engine_ids[rank];
      pick.source.bootstrap_addr = e.spec.bootstrap_addr();
      table_.push_back(std::move(pick));
    }
  }
}

bool PrefillRegistry::is_ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return is_ready_;
}

std::string PrefillRegistry::waiting_for() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : entries_) {
    if (e.is_member && !e.is_ready) {
      return e.waiting_for;
    }
  }
  return is_ready_ ? "" : "a prefill server (none is given or has joined)";
}

std::optional<PrefillPick> PrefillRegistry::next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (table_.empty()) {
    return std::nullopt;
  }
  return table_[next_pick_++ % table_.size()];
}

std::vector<PrefillPick> PrefillRegistry::picks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

void PrefillRegistry::report_unreachable(int index, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_.at(static_cast<size_t>(index));
  if (!e.is_up) {
    return;
  }
  e.is_up = false;
  e.waiting_for = "prefill " + e.spec.server.url + " (" + why + ")";
  CRESCENT_LOG(kWarn) << "proxy: prefill is down: " << e.waiting_for;
  if (on_lost_) {
    on_lost_(index);
  }
  rebuild_table_locked();
}

std::vector<PrefillStatus> PrefillRegistry::statuses() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PrefillStatus> out;
  for (const auto& e : entries_) {
    if (!e.is_member) {
      continue;
    }
    PrefillStatus s;
    s.url = e.spec.server.url;
    s.is_ready = e.is_ready;
    s.is_up = e.is_up;
    s.dp_size = e.is_ready ? static_cast<int>(e.engine_ids.size()) : 0;
    s.waiting_for = e.waiting_for;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace crescent::proxy
