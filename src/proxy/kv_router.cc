#include "proxy/kv_router.h"

#include <algorithm>
#include <limits>

#include "core/clock.h"
#include "core/logging.h"
#include "net/http/http_client.h"

namespace crescent::proxy {

using Json = nlohmann::json;

size_t choose_candidate(std::span<const RouteCandidate> candidates, const RouterWeights& weights,
                        uint64_t tie_counter) {
  CRESCENT_CHECK(!candidates.empty());
  std::vector<size_t> best;
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double score =
        weights.overlap * candidates[i].matched_blocks - weights.load * candidates[i].in_flight;
    if (score > best_score) {
      best_score = score;
      best.assign(1, i);
    } else if (score == best_score) {
      best.push_back(i);
    }
  }
  return best[tie_counter % best.size()];
}

Result<KvEventsAnswer> parse_kv_events(std::string_view body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("engine_id") || !j["engine_id"].is_string() ||
      !j.contains("seq") || !j["seq"].is_number_integer() || !j.contains("events") ||
      !j["events"].is_array()) {
    return invalid_argument("the /v1/kv_events answer lacks engine_id, seq or events");
  }
  KvEventsAnswer out;
  out.engine_id = j["engine_id"].get<std::string>();
  out.seq = j["seq"].get<int64_t>();
  out.reset = j.value("reset", false);
  for (const Json& e : j["events"]) {
    if (!e.is_object() || !e.contains("type") || !e["type"].is_string()) {
      return invalid_argument("a /v1/kv_events event has no type");
    }
    KvEventsAnswer::Event event;
    event.type = e["type"].get<std::string>();
    if (event.type != "stored" && event.type != "removed" && event.type != "cleared") {
      return invalid_argument("a /v1/kv_events event has the unknown type '" + event.type + "'");
    }
    if (e.contains("hashes")) {
      for (const Json& h : e["hashes"]) {
        if (!h.is_number_unsigned()) {
          return invalid_argument("a /v1/kv_events hash is not an unsigned integer");
        }
        event.hashes.push_back(h.get<uint64_t>());
      }
    }
    out.events.push_back(std::move(event));
  }
  return out;
}

KvRouter::KvRouter(std::vector<PrefillSpec> prefills, RouterWeights weights,
                   int64_t poll_interval_ms, size_t max_index_entries)
    : prefills_(std::move(prefills)),
      weights_(weights),
      poll_interval_ms_(poll_interval_ms),
      index_(max_index_entries),
      feeds_(prefills_.size()) {
  CRESCENT_CHECK(static_cast<int>(prefills_.size()) <= KvIndex::kMaxUpstreams);
}

KvRouter::~KvRouter() {
  stop();
}

void KvRouter::start() {
  thread_ = std::thread([this] { poll_loop(); });
}

void KvRouter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void KvRouter::forget_locked(int index) {
  index_.clear(index);
  feeds_[static_cast<size_t>(index)] = Feed{};
}

void KvRouter::forget(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  forget_locked(index);
}

void KvRouter::apply(int index, const KvEventsAnswer& answer) {
  std::lock_guard<std::mutex> lock(mu_);
  Feed& feed = feeds_[static_cast<size_t>(index)];
  if (answer.reset || answer.engine_id != feed.engine_id) {
    if (!feed.engine_id.empty() && answer.engine_id != feed.engine_id) {
      CRESCENT_LOG(kInfo) << "proxy: kv router: prefill " << prefills_[index].server.url
                          << " has a new engine (" << answer.engine_id << "), index reset";
    }
    forget_locked(index);
  }
  for (const KvEventsAnswer::Event& e : answer.events) {
    if (e.type == "stored") {
      index_.store(index, e.hashes);
    } else if (e.type == "removed") {
      index_.remove(index, e.hashes);
    } else {
      index_.clear(index);
    }
  }
  feed.engine_id = answer.engine_id;
  feed.seq = answer.seq;
}

std::vector<int> KvRouter::matched_prefix(std::span<const uint64_t> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.matched_prefix(hashes, static_cast<int>(prefills_.size()));
}

size_t KvRouter::index_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

void KvRouter::poll_loop() {
  // A dead prefill must not hold up the others' feeds for long.
  const int64_t timeout_ms = std::clamp<int64_t>(poll_interval_ms_ * 5, 200, 2000);
  while (true) {
    for (size_t i = 0; i < prefills_.size(); ++i) {
      std::string target;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
          return;
        }
        const Feed& feed = feeds_[i];
        target = "/v1/kv_events?since=" + std::to_string(feed.seq) +
                 (feed.engine_id.empty() ? "" : "&engine_id=" + feed.engine_id);
      }
      const UpstreamUrl& server = prefills_[i].server;
      net::http::HttpClient client(server.host, server.port);
      auto reply = client.request("GET", target, "", {}, Deadline::after_ms(timeout_ms));
      Result<KvEventsAnswer> answer =
          !reply.is_ok()         ? Result<KvEventsAnswer>(reply.status())
          : reply->status != 200 ? Result<KvEventsAnswer>(unavailable(
                                       "/v1/kv_events answers " + std::to_string(reply->status)))
                                 : parse_kv_events(reply->body);
      if (answer.is_ok()) {
        apply(static_cast<int>(i), *answer);
      } else {
        CRESCENT_LOG(kDebug) << "proxy: kv router: no KV events from " << server.url << ": "
                             << answer.status().message();
        forget(static_cast<int>(i));
        if (!reply.is_ok() && reply.status().code() == StatusCode::kUnavailable &&
            on_unreachable_) {
          on_unreachable_(static_cast<int>(i), reply.status());
        }
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(poll_interval_ms_), [&] { return stopping_; });
    if (stopping_) {
      return;
    }
  }
}

Result<std::vector<uint64_t>> KvRouter::prompt_hashes(int index, const Json& body,
                                                      const std::string& authorization,
                                                      int64_t timeout_ms) const {
  Json ask = Json::object();
  for (const char* key : {"prompt", "messages", "chat_template", "chat_template_kwargs",
                          "add_generation_prompt", "continue_final_message", "tools"}) {
    if (body.contains(key)) {
      ask[key] = body[key];
    }
  }
  ask["return_block_hashes"] = true;
  const UpstreamUrl& server = prefills_[static_cast<size_t>(index)].server;
  net::http::HttpClient client(server.host, server.port);
  net::http::Headers headers = {{"content-type", "application/json"}};
  if (!authorization.empty()) {
    headers["authorization"] = authorization;
  }
  auto reply =
      client.request("POST", "/tokenize", ask.dump(-1, ' ', false, Json::error_handler_t::replace),
                     headers, Deadline::after_ms(timeout_ms));
  if (!reply.is_ok()) {
    return reply.status();
  }
  if (reply->status != 200) {
    return unavailable("/tokenize at " + server.url + " answers " + std::to_string(reply->status));
  }
  Json j = Json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("block_hashes") || !j["block_hashes"].is_array()) {
    return unavailable("/tokenize at " + server.url + " gave no block_hashes");
  }
  std::vector<uint64_t> hashes;
  for (const Json& h : j["block_hashes"]) {
    if (!h.is_number_unsigned()) {
      return unavailable("/tokenize at " + server.url + " gave a hash that is not unsigned");
    }
    hashes.push_back(h.get<uint64_t>());
  }
  return hashes;
}

}  // namespace crescent::proxy
