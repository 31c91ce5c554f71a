#include "proxy/proxy_server.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/clock.h"
#include "core/logging.h"
#include "net/http/http_client.h"
#include "proxy/api_error.h"
#include "proxy/completion_relay.h"
#include "proxy/request_rewrite.h"

namespace crescent::proxy {
namespace {

using net::http::Request;
using net::http::ResponseWriter;

void send_error(ResponseWriter& writer, int status, const std::string& message,
                net::http::Headers headers = {}) {
  writer.send(status, "application/json", error_body(status, message, error_type_for(status)),
              std::move(headers));
}

Deadline deadline_after_s(double seconds) {
  return Deadline::after(std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)));
}

int64_t steady_now_ms() {
  return now_ns() / 1'000'000;
}

// How often the prober looks for due probes, and how long one /health probe may take.
constexpr std::chrono::milliseconds kProbeTick{50};
constexpr int64_t kProbeTimeoutMs = 1000;

std::vector<std::string> urls_of(const std::vector<UpstreamUrl>& pool) {
  std::vector<std::string> urls;
  for (const auto& u : pool) {
    urls.push_back(u.url);
  }
  return urls;
}

// GET /v1/models, POST /tokenize and /detokenize relayed whole to one decode server (every
// server of a deployment serves the same model with the same tokenizer).
class WholeRelay : public std::enable_shared_from_this<WholeRelay> {
 public:
  WholeRelay(ApiEndpoint endpoint, std::string decode_url, std::shared_ptr<ResponseWriter> writer,
             ProxyMetrics* metrics, std::function<void(const Status&)> on_unreachable)
      : endpoint_(endpoint),
        decode_url_(std::move(decode_url)),
        writer_(std::move(writer)),
        metrics_(metrics),
        on_unreachable_(std::move(on_unreachable)) {}

  void start(UpstreamClient* upstream, const UpstreamUrl& decode, UpstreamRequest request,
             Deadline deadline) {
    writer_->on_close([weak = weak_from_this()] {
      if (auto self = weak.lock()) {
        std::lock_guard<std::mutex> lock(self->mu_);
        if (self->call_) {
          self->call_->cancel();
        }
      }
    });
    auto self = shared_from_this();
    std::lock_guard<std::mutex> lock(mu_);
    call_ = upstream->start(
        decode.host, decode.port, std::move(request),
        {.on_headers = [self](int status,
                              const net::http::Headers& h) { self->on_headers(status, h); },
         .on_data = [self](std::string data) { self->on_data(std::move(data)); },
         .on_done = [self](Status s) { self->on_done(std::move(s)); }},
        deadline);
  }

 private:
  void on_headers(int status, const net::http::Headers& headers) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    auto it = headers.find("content-type");
    content_type_ = it == headers.end() ? "application/json" : it->second;
  }
  void on_data(std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    body_ += data;
  }
  void on_done(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    call_.reset();
    if (s.is_ok()) {
      metrics_->count_request(endpoint_, status_ < 400 ? Outcome::kOk : Outcome::kDecodeError);
      writer_->send(status_, content_type_, std::move(body_));
      return;
    }
    if (s.code() == StatusCode::kCancelled) {
      metrics_->count_request(endpoint_, Outcome::kClientDisconnected);
      return;
    }
    metrics_->count_upstream_error(UpstreamSide::kDecode);
    if (s.code() == StatusCode::kUnavailable && status_ == 0) {
      on_unreachable_(s);
    }
    bool timed_out = s.code() == StatusCode::kDeadlineExceeded;
    metrics_->count_request(endpoint_, timed_out ? Outcome::kTimeout : Outcome::kDecodeError);
    send_error(*writer_, timed_out ? 504 : 502, "decode " + decode_url_ + ": " + s.message());
  }

  ApiEndpoint endpoint_;
  std::string decode_url_;
  std::shared_ptr<ResponseWriter> writer_;
  ProxyMetrics* metrics_;
  std::function<void(const Status&)> on_unreachable_;
  std::mutex mu_;
  std::shared_ptr<UpstreamCall> call_;  // guarded by mu_
  int status_ = 0;                      // guarded by mu_
  std::string content_type_;            // guarded by mu_
  std::string body_;                    // guarded by mu_
};

}  // namespace

ProxyServer::ProxyServer(ProxyOptions options)
    : options_(std::move(options)),
      registry_(options_.prefills, options_.poll_interval_ms, options_.refresh_interval_ms),
      decode_health_(urls_of(is_pd_mode() ? options_.pds : options_.decodes)),
      decode_urls_(is_pd_mode() ? options_.pds : options_.decodes),
      encoder_router_(std::max<size_t>(1, options_.encoders.size()),
                      options_.max_encoder_affinity_entries) {
  std::vector<std::string> encoder_urls;
  for (const auto& e : options_.encoders) {
    encoder_urls.push_back(e.url);
  }
  metrics_.set_encoders(std::move(encoder_urls));
  UpstreamClientOptions upstream;
  upstream.num_io_threads = std::max(1, options_.num_io_threads);
  upstream_ = std::make_unique<UpstreamClient>(upstream);
  body_workers_ = std::make_unique<TaskQueue>(1);
  // Bulk work: on a shared core, the threads relaying tokens go first.
  body_workers_->post([] { ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10); });
  if (options_.kv_aware_router && !is_pd_mode()) {
    kv_router_ = std::make_unique<KvRouter>(options_.prefills,
                                            RouterWeights{.overlap = options_.router_overlap_weight,
                                                          .load = options_.router_load_weight},
                                            options_.router_poll_interval_ms,
                                            options_.router_max_index_entries);
    prefill_load_ = std::make_unique<std::atomic<int>[]>(options_.prefills.size());
    decode_load_ = std::make_unique<std::atomic<int>[]>(options_.decodes.size());
    registry_.set_on_lost([router = kv_router_.get()](int index) { router->forget(index); });
    kv_router_->set_on_unreachable([this](int index, const Status& why) {
      registry_.report_unreachable(index, "its /v1/kv_events: " + why.message());
    });
    metrics_.set_router_index_entries(0);
    route_workers_ = std::make_unique<TaskQueue>(2);
  }
}

Result<std::unique_ptr<ProxyServer>> ProxyServer::start(ProxyOptions options) {
  if (!options.pds.empty()) {
    if (!options.prefills.empty() || !options.decodes.empty()) {
      return invalid_argument(
          "colocated prefill+decode servers (pds) cannot be mixed with prefill and decode ones");
    }
  } else if ((options.prefills.empty() || options.decodes.empty()) &&
             options.discover_url.empty()) {
    return invalid_argument(
        "the proxy needs at least one prefill and one decode server, or one pd server");
  }
  if (!options.discover_url.empty() && (!options.pds.empty() || options.kv_aware_router)) {
    return invalid_argument("--discover cannot be combined with --pd or --router kv_aware");
  }
  if (options.kv_aware_router &&
      (!options.pds.empty() || options.prefills.size() > size_t{KvIndex::kMaxUpstreams})) {
    return invalid_argument("the kv_aware router needs 1 to 64 prefill servers and no pd ones");
  }
  std::unique_ptr<ProxyServer> proxy(new ProxyServer(std::move(options)));
  if (!proxy->options_.api_key.empty()) {
    ASSIGN_OR_RETURN(proxy->api_key_, net::http::ApiKeyCheck::make(proxy->options_.api_key));
  }
  if (!proxy->options_.upstream_api_key.empty()) {
    RETURN_IF_ERROR(net::http::ApiKeyCheck::make(proxy->options_.upstream_api_key).status());
  }
  if (!proxy->options_.discover_url.empty()) {
    // The first read happens here, so the members are known before the pollers start; set
    // before listening, since /health and /metrics read watcher_.
    proxy->watcher_ = std::make_unique<MemberWatcher>(
        [url = proxy->options_.discover_url] {
          return bootstrap::read_cluster_members(url, Deadline::after_ms(kProbeTimeoutMs));
        },
        [p = proxy.get()](const MembershipChange& change) { p->apply_membership(change); },
        proxy->options_.discover_interval_ms);
    proxy->watcher_->start();
  }
  net::http::ServerOptions http;
  http.host = proxy->options_.host;
  http.port = proxy->options_.port;
  http.num_io_threads = std::max(1, proxy->options_.num_io_threads);
  http.max_body_bytes = proxy->options_.max_body_bytes;
  ASSIGN_OR_RETURN(
      proxy->http_,
      net::http::Server::start(
          http, [p = proxy.get()](Request request, std::shared_ptr<ResponseWriter> writer) {
            p->handle(std::move(request), std::move(writer));
          }));
  proxy->registry_.start();
  if (proxy->kv_router_) {
    proxy->kv_router_->start();
  }
  proxy->probe_thread_ = std::thread([p = proxy.get()] { p->probe_loop(); });
  return proxy;
}

ProxyServer::~ProxyServer() {
  stop();
}

int ProxyServer::port() const {
  return http_->port();
}

void ProxyServer::stop_accepting() {
  http_->stop_accepting();
}

void ProxyServer::stop() {
  if (stopped_.exchange(true)) {
    return;
  }
  if (http_) {  // null when start() failed to listen
    http_->stop();
  }
  // Ends the relays still in flight: their upstream connections close, so the servers abort.
  upstream_->shutdown();
  if (watcher_) {
    watcher_->stop();
  }
  registry_.stop();
  if (kv_router_) {
    kv_router_->stop();
  }
  {
    std::lock_guard<std::mutex> lock(probe_mu_);
    is_probe_stopping_ = true;
  }
  probe_cv_.notify_all();
  if (probe_thread_.joinable()) {
    probe_thread_.join();
  }
}

std::optional<size_t> ProxyServer::next_decode() {
  std::optional<size_t> next = decode_health_.next_up();
  if (!next || !kv_router_) {
    return next;
  }
  // By load: the fewest in flight, starting the scan at the rotation's pick for fair ties.
  const size_t n = options_.decodes.size();
  size_t best = *next;
  for (size_t k = 1; k < n; ++k) {
    const size_t i = (*next + k) % n;
    if (decode_health_.is_up(i) && decode_load_[i].load() < decode_load_[best].load()) {
      best = i;
    }
  }
  return best;
}

std::optional<PrefillPick> ProxyServer::pick_prefill(const Json& body,
                                                     const std::string& authorization) {
  if (!kv_router_) {
    std::optional<PrefillPick> pick = registry_.next();
    if (pick) {
      metrics_.count_router_decision("round_robin", "round_robin");
    }
    return pick;
  }
  std::vector<PrefillPick> picks = registry_.picks();
  if (picks.empty()) {
    return std::nullopt;
  }
  const uint64_t turn = route_counter_.fetch_add(1);
  // The prompt's block hashes, from the prefills in turn (they all hash alike).
  const PrefillPick& asked = picks[turn % picks.size()];
  auto hashes = kv_router_->prompt_hashes(asked.prefill_index, body, authorization,
                                          options_.router_tokenize_timeout_ms);
  if (!hashes.is_ok()) {
    CRESCENT_LOG(kDebug) << "proxy: kv router: no block hashes for a prompt: "
                         << hashes.status().message();
  }
  std::vector<uint64_t> prompt =
      hashes.is_ok() ? std::move(hashes).value() : std::vector<uint64_t>{};
  std::vector<int> matched = kv_router_->matched_prefix(prompt);
  std::vector<RouteCandidate> candidates;
  for (const PrefillPick& p : picks) {
    candidates.push_back({.matched_blocks = matched[static_cast<size_t>(p.prefill_index)],
                          .in_flight = prefill_load_[p.prefill_index].load()});
  }
  const size_t chosen = choose_candidate(candidates, kv_router_->weights(), turn);
  const int got = candidates[chosen].matched_blocks;
  metrics_.count_router_decision("kv_aware", !hashes.is_ok() ? "no_hashes"
                                             : got > 0       ? "prefix_hit"
                                                             : "no_prefix_hit");
  metrics_.count_router_blocks(got, static_cast<int>(prompt.size()));
  metrics_.set_router_index_entries(static_cast<int64_t>(kv_router_->index_size()));
  CRESCENT_LOG(kDebug)
      << "proxy: kv router: prefill "
      << options_.prefills[static_cast<size_t>(picks[chosen].prefill_index)].server.url << " holds "
      << got << " of " << prompt.size() << " prompt blocks, " << candidates[chosen].in_flight
      << " in flight";
  return picks[chosen];
}

void ProxyServer::answer_no_decode(ApiEndpoint endpoint, const std::string& request_id,
                                   ResponseWriter& writer) {
  metrics_.count_request(endpoint, Outcome::kNotReady);
  const char* role = is_pd_mode() ? "pd" : "decode";
  net::http::Headers headers;
  if (!request_id.empty()) {
    headers["X-Request-Id"] = request_id;
  }
  std::string down = decode_health_.describe_down();
  send_error(writer, 503,
             std::string("no ") + role + " server is up: " +
                 (down.empty() ? "none is given or has joined" : down) + "; retry later",
             std::move(headers));
}

UpstreamUrl ProxyServer::decode_url(size_t index) const {
  std::lock_guard<std::mutex> lock(decode_urls_mu_);
  return decode_urls_.at(index);
}

void ProxyServer::apply_membership(const MembershipChange& change) {
  // The servers on the command line come first in both tables and never leave, even when one
  // of them is also a member whose key went away.
  for (const ClusterMember& m : change.left) {
    if (m.role == "decode") {
      auto index = decode_health_.find(m.url);
      if (index && *index >= options_.decodes.size()) {
        decode_health_.remove(*index);
      }
    } else if (m.role == "prefill") {
      auto spec = prefill_spec_of(m);
      if (spec.is_ok()) {
        auto index = registry_.find(*spec);
        if (index && static_cast<size_t>(*index) >= options_.prefills.size()) {
          registry_.remove(*index);
        }
      }
    }
  }
  for (const ClusterMember& m : change.joined) {
    if (m.role == "decode") {
      auto url = parse_upstream_url(m.url);
      if (!url.is_ok()) {
        CRESCENT_LOG(kWarn) << "proxy: ignoring decode member " << m.engine_id << ": "
                            << url.status().message();
        continue;
      }
      std::lock_guard<std::mutex> lock(decode_urls_mu_);
      if (!decode_health_.find(url->url)) {
        decode_urls_.push_back(*url);
      }
      const size_t index = decode_health_.add(url->url);
      CRESCENT_CHECK(index < decode_urls_.size() && decode_urls_[index].url == url->url)
          << "decode pool and its health table disagree at " << index;
    } else if (m.role == "prefill") {
      auto spec = prefill_spec_of(m);
      if (!spec.is_ok()) {
        CRESCENT_LOG(kWarn) << "proxy: ignoring prefill member " << m.engine_id << ": "
                            << spec.status().message();
        continue;
      }
      registry_.add(std::move(spec).value());
    }
  }
}

void ProxyServer::probe_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(probe_mu_);
      if (probe_cv_.wait_for(lock, kProbeTick, [&] { return is_probe_stopping_; })) {
        return;
      }
    }
    for (size_t i : decode_health_.take_due_probes(steady_now_ms())) {
      // A fresh connection per probe: the server may have restarted since the last one.
      const UpstreamUrl url = decode_url(i);
      net::http::HttpClient client(url.host, url.port);
      auto health = client.request("GET", "/health", "", {}, Deadline::after_ms(kProbeTimeoutMs));
      if (health.is_ok() && health->status == 200) {
        decode_health_.probe_succeeded(i);
      } else {
        decode_health_.probe_failed(i, steady_now_ms(),
                                    health.is_ok()
                                        ? "/health answers " + std::to_string(health->status)
                                        : "/health: " + health.status().message());
      }
    }
  }
}

void ProxyServer::release_request_id(const std::string& id) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  ids_in_flight_.erase(id);
}

std::string ProxyServer::upstream_authorization(const Request& request) const {
  if (!options_.upstream_api_key.empty()) {
    return "Bearer " + options_.upstream_api_key;
  }
  std::string authorization = request.header("authorization");
  return authorization.empty() ? options_.default_authorization : authorization;
}

void ProxyServer::handle(Request request, std::shared_ptr<ResponseWriter> writer) {
  if (auto refusal = api_key_.refusal(request)) {
    return send_error(*writer, 401, *refusal, net::http::unauthorized_headers());
  }
  const std::string& path = request.path;
  auto require_method = [&](const char* method) {
    if (request.method == method) {
      return true;
    }
    send_error(*writer, 405, path + " accepts " + method + ", not " + request.method,
               {{"Allow", method}});
    return false;
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (require_method("POST")) {
      // Decided before `request` is moved: `path` refers into it.
      ApiEndpoint endpoint =
          path == "/v1/completions" ? ApiEndpoint::kCompletions : ApiEndpoint::kChatCompletions;
      if (route_workers_ && request.body.size() < kLargeBodyBytes) {
        // Picking a prefill may call one: off the I/O threads.
        auto shared = std::make_shared<Request>(std::move(request));
        route_workers_->post([this, endpoint, shared, writer] {
          handle_completion(endpoint, std::move(*shared), writer);
        });
        return;
      }
      if (request.body.size() >= kLargeBodyBytes) {
        auto shared = std::make_shared<Request>(std::move(request));
        body_workers_->post([this, endpoint, shared, writer] {
          handle_completion(endpoint, std::move(*shared), writer);
        });
        return;
      }
      handle_completion(endpoint, std::move(request), writer);
    }
  } else if (path == "/v1/models") {
    if (require_method("GET")) {
      relay_whole(ApiEndpoint::kModels, request, writer);
    }
  } else if (path == "/tokenize" || path == "/detokenize") {
    if (require_method("POST")) {
      relay_whole(path == "/tokenize" ? ApiEndpoint::kTokenize : ApiEndpoint::kDetokenize, request,
                  writer);
    }
  } else if (path == "/health") {
    if (require_method("GET")) {
      if (!is_ready()) {
        send_error(*writer, 503, "not ready: waiting for " + registry_.waiting_for());
      } else if (decode_health_.num_up() == 0) {
        // A load balancer in front must not send here: every request would get a 503.
        send_error(*writer, 503,
                   std::string("not ready: no ") + (is_pd_mode() ? "pd" : "decode") +
                       " server is up: " + decode_health_.describe_down());
      } else if (watcher_ && !watcher_->stats().is_reachable) {
        // Serving with the last known members; say so without failing the check.
        Json note = {{"status", "ok"},
                     {"discovery", "etcd unreachable, using the last known members: " +
                                       watcher_->stats().last_error}};
        writer->send(200, "application/json", note.dump());
      } else {
        writer->send(200, "application/json", R"({"status":"ok"})");
      }
    }
  } else if (path == "/metrics") {
    if (require_method("GET")) {
      if (kv_router_) {
        metrics_.set_router_index_entries(static_cast<int64_t>(kv_router_->index_size()));
      }
      std::string text = metrics_.render(registry_.statuses(), decode_health_.states(),
                                         is_pd_mode() ? "pd" : "decode");
      if (watcher_) {
        text += watcher_->render_metrics();
      }
      writer->send(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
    }
  } else {
    send_error(*writer, 404, "no route for " + request.method + " " + path);
  }
}

void ProxyServer::handle_completion(ApiEndpoint endpoint, Request request,
                                    const std::shared_ptr<ResponseWriter>& writer) {
  int64_t arrival_ns = now_ns();
  auto request_id = request_id_for(request);
  if (!request_id.is_ok()) {
    metrics_.count_request(endpoint, Outcome::kBadRequest);
    return send_error(*writer, 400, request_id.status().message());
  }
  auto body = parse_client_body(request.body);
  if (!body.is_ok()) {
    metrics_.count_request(endpoint, Outcome::kBadRequest);
    return send_error(*writer, 400, body.status().message(), {{"X-Request-Id", *request_id}});
  }
  if (decode_health_.num_up() == 0) {
    // Nothing could stream the answer: no prefill server computes (and holds) KV for it.
    return answer_no_decode(endpoint, *request_id, *writer);
  }
  std::string authorization = upstream_authorization(request);
  std::optional<PrefillPick> pick;
  if (!is_pd_mode()) {
    pick = pick_prefill(*body, authorization);
    if (!pick) {
      metrics_.count_request(endpoint, Outcome::kNotReady);
      return send_error(*writer, 503, "not ready: waiting for " + registry_.waiting_for(),
                        {{"X-Request-Id", *request_id}});
    }
  }
  {
    std::lock_guard<std::mutex> lock(ids_mu_);
    if (!ids_in_flight_.insert(*request_id).second) {
      metrics_.count_request(endpoint, Outcome::kBadRequest);
      return send_error(*writer, 409,
                        "X-Request-Id '" + *request_id +
                            "' belongs to a request still in flight; its transfer id must be "
                            "unique");
    }
  }
  Completion completion;
  completion.endpoint = endpoint;
  completion.request_id = *request_id;
  completion.arrival_ns = arrival_ns;
  completion.deadline = deadline_after_s(options_.request_timeout_s);
  completion.target = request.path;
  completion.authorization = std::move(authorization);
  completion.raw_body = std::move(request.body);
  completion.body = std::move(body).value();
  completion.pick = std::move(pick);

  std::vector<ImagePart> images;
  if (!options_.encoders.empty() && endpoint == ApiEndpoint::kChatCompletions) {
    images = find_image_parts(completion.body);
  }
  if (images.empty()) {
    return dispatch(completion, nullptr, writer);
  }
  // EPD: the images are encoded first; P/D start once every encoder answered.
  EncodePlan plan;
  plan.endpoint = endpoint;
  plan.request_id = completion.request_id;
  plan.request_deadline = completion.deadline;
  Deadline encode_deadline = deadline_after_s(options_.encode_timeout_s);
  plan.encode_deadline =
      encode_deadline.when() < completion.deadline.when() ? encode_deadline : completion.deadline;
  plan.encode_timeout_s = options_.encode_timeout_s;
  plan.images = std::move(images);
  plan.client_body = completion.body;
  plan.authorization = completion.authorization;
  plan.encoders = &options_.encoders;
  plan.router = &encoder_router_;
  plan.on_failed = [this, id = completion.request_id] { release_request_id(id); };
  auto shared = std::make_shared<Completion>(std::move(completion));
  // Called on an upstream I/O thread: a large body's rewrite goes to the body workers.
  plan.on_encoded = [this, shared, writer](Json items) {
    if (shared->raw_body.size() < kLargeBodyBytes) {
      return dispatch(*shared, &items, writer);
    }
    auto shared_items = std::make_shared<Json>(std::move(items));
    body_workers_->post(
        [this, shared, shared_items, writer] { dispatch(*shared, shared_items.get(), writer); });
  };
  start_encoder_stage(std::move(plan), upstream_.get(), &metrics_, writer);
}

void ProxyServer::dispatch(const Completion& completion, const Json* ec_items,
                           const std::shared_ptr<ResponseWriter>& writer) {
  RelayPlan plan;
  plan.endpoint = completion.endpoint;
  plan.request_id = completion.request_id;
  plan.arrival_ns = completion.arrival_ns;
  plan.deadline = completion.deadline;
  plan.max_buffered_response_bytes = options_.max_buffered_response_bytes;
  std::optional<size_t> decode_index = next_decode();
  if (!decode_index) {  // the last one went down since the request arrived
    answer_no_decode(completion.endpoint, completion.request_id, *writer);
    return release_request_id(completion.request_id);
  }
  plan.on_released = [this, id = completion.request_id, index = *decode_index] {
    if (decode_load_) {
      decode_load_[index].fetch_sub(1);
    }
    release_request_id(id);
  };
  if (decode_load_) {
    decode_load_[*decode_index].fetch_add(1);
  }
  plan.decode = decode_url(*decode_index);
  plan.on_decode_unreachable = [this, index = *decode_index](const Status& why) {
    decode_health_.report_unreachable(index, steady_now_ms(), why.message());
  };
  if (is_pd_mode()) {
    // One server prefills and decodes: the client's body, plus the encoders' items.
    plan.has_prefill = false;
    plan.decode_role = "pd";
    std::string body = completion.raw_body;
    if (ec_items != nullptr) {
      Json j = completion.body;
      j["ec_transfer_params"] = Json{{"items", *ec_items}};
      body = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    plan.decode_request = {
        .method = "POST",
        .target = completion.target,
        .headers = decode_headers(completion.request_id, completion.authorization),
        .body = std::move(body)};
    return start_completion_relay(std::move(plan), upstream_.get(), &metrics_, writer);
  }
  const PrefillPick& pick = *completion.pick;
  const PrefillSpec prefill = registry_.spec(pick.prefill_index);
  std::string transfer_id = transfer_id_for(completion.request_id);
  plan.prefill = prefill.server;
  plan.on_prefill_unreachable = [this, index = pick.prefill_index](const Status& why) {
    registry_.report_unreachable(index, why.message());
  };
  plan.on_prefill_abandoned = [this, index = pick.prefill_index] { registry_.poll_soon(index); };
  if (prefill_load_) {
    prefill_load_[pick.prefill_index].fetch_add(1);
    plan.on_prefill_ended = [this, index = pick.prefill_index] {
      prefill_load_[index].fetch_sub(1);
    };
  }
  std::string decode;
  if (ec_items != nullptr) {
    // P pulls the encoders' tensors; D gets the same items only to learn each image's mm_hash
    // and grid (its positions and prefix-cache keys), and no pixels to parse or decode; P gets
    // the images too unless --prefill-images ref.
    Json with_items = completion.body;
    with_items["ec_transfer_params"] = Json{{"items", *ec_items}};
    if (!options_.prefill_image_refs) {
      plan.prefill_request.body = prefill_body(with_items, transfer_id);
    }
    replace_image_urls_with_ec_refs(with_items, *ec_items);
    if (options_.prefill_image_refs) {
      plan.prefill_request.body = prefill_body(with_items, transfer_id);
    }
    decode = decode_body(with_items, transfer_id, pick.source);
  } else {
    plan.prefill_request.body = prefill_body(completion.body, transfer_id);
    decode = decode_body(completion.body, transfer_id, pick.source);
  }
  plan.prefill_request.method = "POST";
  plan.prefill_request.target = completion.target;
  plan.prefill_request.headers =
      prefill_headers(completion.request_id, pick.source.dp_rank, completion.authorization);
  plan.decode_request = {.method = "POST",
                         .target = completion.target,
                         .headers = decode_headers(completion.request_id, completion.authorization),
                         .body = std::move(decode)};
  start_completion_relay(std::move(plan), upstream_.get(), &metrics_, writer);
}

void ProxyServer::relay_whole(ApiEndpoint endpoint, const Request& request,
                              const std::shared_ptr<ResponseWriter>& writer) {
  std::optional<size_t> decode_index = next_decode();
  if (!decode_index) {
    return answer_no_decode(endpoint, "", *writer);
  }
  const UpstreamUrl decode = decode_url(*decode_index);
  UpstreamRequest upstream_request;
  upstream_request.method = request.method;
  upstream_request.target = request.path;
  upstream_request.body = request.body;
  const std::string authorization = upstream_authorization(request);
  if (!authorization.empty()) {
    upstream_request.headers["Authorization"] = authorization;
  }
  if (!request.body.empty()) {
    upstream_request.headers["Content-Type"] = "application/json";
  }
  auto relay = std::make_shared<WholeRelay>(
      endpoint, decode.url, writer, &metrics_, [this, index = *decode_index](const Status& why) {
        decode_health_.report_unreachable(index, steady_now_ms(), why.message());
      });
  relay->start(upstream_.get(), decode, std::move(upstream_request),
               deadline_after_s(std::min(options_.request_timeout_s, 60.0)));
}

}  // namespace crescent::proxy
