#include "proxy/encoder_stage.h"

#include <nlohmann/json.hpp>

#include "core/fnv.h"
#include "core/logging.h"
#include "proxy/api_error.h"

namespace crescent::proxy {
namespace {

// An encoder answers a few KiB of item descriptors; anything far larger is not an answer.
constexpr size_t kMaxEncoderAnswerBytes = 16 << 20;

bool is_success(int status) {
  return status >= 200 && status < 300;
}

// The URL of an image part, or nullopt when it is not an image part.
std::optional<std::string> image_url_of(const Json& part) {
  if (!part.is_object()) {
    return std::nullopt;
  }
  auto type = part.find("type");
  if (type == part.end() || !type->is_string() || type->get<std::string>() != "image_url") {
    return std::nullopt;
  }
  auto image = part.find("image_url");
  if (image == part.end()) {
    return std::nullopt;
  }
  if (image->is_string()) {
    return image->get<std::string>();
  }
  if (image->is_object()) {
    auto url = image->find("url");
    if (url != image->end() && url->is_string()) {
      return url->get<std::string>();
    }
  }
  return std::nullopt;
}

uint64_t image_key(const std::string& url) {
  // A data: URL is its bytes; its media type prefix does not change the image.
  if (url.rfind("data:", 0) == 0) {
    if (size_t comma = url.find(','); comma != std::string::npos) {
      return fnv1a64(std::string_view(url).substr(comma + 1));
    }
  }
  return fnv1a64(url);
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

class EncoderStage : public std::enable_shared_from_this<EncoderStage> {
 public:
  EncoderStage(EncodePlan plan, ProxyMetrics* metrics,
               std::shared_ptr<net::http::ResponseWriter> writer)
      : plan_(std::move(plan)),
        metrics_(metrics),
        writer_(std::move(writer)),
        calls_(plan_.images.size()),
        answers_(plan_.images.size()),
        encoder_of_(plan_.images.size(), 0),
        items_(plan_.images.size()) {
    metrics_->add_in_flight(1);
  }

  ~EncoderStage() {
    if (!finished_) {  // only when the upstream client shut down under it
      metrics_->add_in_flight(-1);
      if (plan_.on_failed) {
        plan_.on_failed();
      }
    }
  }

  void start(UpstreamClient* upstream) {
    writer_->on_close([weak = weak_from_this()] {
      if (auto self = weak.lock()) {
        self->on_client_closed();
      }
    });
    auto self = shared_from_this();
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {
      return;
    }
    started_ns_ = now_ns();
    num_pending_ = plan_.images.size();
    for (size_t i = 0; i < plan_.images.size(); ++i) {
      EncoderRouter::Pick pick = plan_.router->pick(plan_.images[i].key);
      encoder_of_[i] = pick.encoder_index;
      if (pick.is_affinity) {
        metrics_->count_encoder_affinity();
      }
      metrics_->count_encoder_request(pick.encoder_index);
      const UpstreamUrl& encoder = encoder_url(i);
      UpstreamRequest request;
      request.method = "POST";
      request.target = "/v1/chat/completions";
      // Each image is its own request on the encoder: ids must not collide there.
      request.headers =
          decode_headers(plan_.request_id + "-img" + std::to_string(i), plan_.authorization);
      request.body = encoder_body(plan_.client_body, plan_.images[i].part);
      calls_[i] = upstream->start(
          encoder.host, encoder.port, std::move(request),
          {.on_headers = [self, i](int status,
                                   const net::http::Headers&) { self->on_headers(i, status); },
           .on_data = [self, i](std::string data) { self->on_data(i, std::move(data)); },
           .on_done = [self, i](Status s) { self->on_done(i, std::move(s)); }},
          plan_.encode_deadline);
    }
  }

 private:
  struct Answer {
    int status = 0;
    std::string body;
  };

  const UpstreamUrl& encoder_url(size_t image) const {
    return (*plan_.encoders)[static_cast<size_t>(encoder_of_[image])];
  }

  void cancel_all_locked() {
    for (auto& call : calls_) {
      if (call) {
        call->cancel();
      }
    }
  }

  // Ends the stage without P/D. Under mu_.
  void finish_failed_locked(Outcome outcome) {
    finished_ = true;
    metrics_->count_request(plan_.endpoint, outcome);
    metrics_->add_in_flight(-1);
    cancel_all_locked();
    if (plan_.on_failed) {
      plan_.on_failed();
    }
  }

  void fail_locked(int http_status, const std::string& message, Outcome outcome) {
    CRESCENT_LOG(kWarn) << "proxy: request " << plan_.request_id << ": " << message;
    finish_failed_locked(outcome);
    writer_->send(http_status, "application/json",
                  error_body(http_status, message, error_type_for(http_status)),
                  {{"X-Request-Id", plan_.request_id}});
  }

  void on_client_closed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {
      return;
    }
    CRESCENT_LOG(kInfo) << "proxy: request " << plan_.request_id
                        << ": the client went away while its images were encoded";
    finish_failed_locked(Outcome::kClientDisconnected);
  }

  void on_headers(size_t i, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_[i].status = status;
  }

  void on_data(size_t i, std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    Answer& a = answers_[i];
    if (a.body.size() + data.size() > kMaxEncoderAnswerBytes) {
      if (!finished_) {
        metrics_->count_encoder_failure(encoder_of_[i]);
        metrics_->count_upstream_error(UpstreamSide::kEncoder);
        plan_.router->forget(plan_.images[i].key, encoder_of_[i]);
        fail_locked(502,
                    "encoder " + encoder_url(i).url + " answered more than " +
                        std::to_string(kMaxEncoderAnswerBytes) + " bytes for image " +
                        std::to_string(i),
                    Outcome::kEncoderError);
      }
      return;
    }
    a.body += data;
  }

  void on_done(size_t i, Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    calls_[i].reset();
    if (finished_ || status.code() == StatusCode::kCancelled) {
      return;
    }
    const std::string& url = encoder_url(i).url;
    const Answer& a = answers_[i];
    std::string what;  // why it failed, "" when it did not
    int http_status = 502;
    Outcome outcome = Outcome::kEncoderError;
    std::vector<Json> items;
    if (!status.is_ok()) {
      if (status.code() == StatusCode::kDeadlineExceeded) {
        if (plan_.request_deadline.is_expired()) {
          http_status = 504;
          outcome = Outcome::kTimeout;
          what = "request timed out waiting for encoder " + url;
        } else {
          what = "encoder " + url + " did not answer within " +
                 format_seconds(plan_.encode_timeout_s) + " s (--encode-timeout-s)";
        }
      } else {
        what = "encoder " + url + " failed: " + status.message();
      }
    } else if (a.status >= 400 && a.status < 500) {
      // The client's image is at fault: the encoder's own answer is the client's.
      metrics_->count_encoder_failure(encoder_of_[i]);
      plan_.router->forget(plan_.images[i].key, encoder_of_[i]);
      CRESCENT_LOG(kInfo) << "proxy: request " << plan_.request_id << ": encoder " << url
                          << " refused image " << i << " with " << a.status;
      finish_failed_locked(Outcome::kEncoderError);
      std::string body = is_openai_error(a.body) ? a.body
                                                 : error_body(a.status,
                                                              "encoder " + url + " answered " +
                                                                  std::to_string(a.status) + ": " +
                                                                  upstream_error_message(a.body),
                                                              error_type_for(a.status));
      writer_->send(a.status, "application/json", std::move(body),
                    {{"X-Request-Id", plan_.request_id}});
      return;
    } else if (!is_success(a.status)) {
      http_status = a.status == 503 ? 503 : 502;
      what = "encoder " + url + " answered " + std::to_string(a.status) + ": " +
             upstream_error_message(a.body);
    } else {
      auto parsed = parse_encoder_items(a.body);
      if (parsed.is_ok()) {
        items = std::move(parsed).value();
      } else {
        what = "encoder " + url +
               " answered without usable ec_transfer_params: " + parsed.status().message();
      }
    }
    if (!what.empty()) {
      metrics_->count_encoder_failure(encoder_of_[i]);
      metrics_->count_upstream_error(UpstreamSide::kEncoder);
      plan_.router->forget(plan_.images[i].key, encoder_of_[i]);
      return fail_locked(http_status, what + " (image " + std::to_string(i) + ")", outcome);
    }
    items_[i] = std::move(items);
    if (--num_pending_ > 0) {
      return;
    }
    finished_ = true;
    metrics_->observe_encode(static_cast<double>(now_ns() - started_ns_) * 1e-9);
    Json merged = Json::array();
    for (auto& per_image : items_) {
      for (auto& item : per_image) {
        merged.push_back(std::move(item));
      }
    }
    auto on_encoded = std::move(plan_.on_encoded);
    lock.unlock();
    // Still in flight for the drain while P/D start; the relay counts itself from here on.
    on_encoded(std::move(merged));
    metrics_->add_in_flight(-1);
  }

  static std::string format_seconds(double s) {
    std::string text = std::to_string(s);
    text.erase(text.find_last_not_of('0') + 1);
    if (!text.empty() && text.back() == '.') {
      text.pop_back();
    }
    return text;
  }

  EncodePlan plan_;
  ProxyMetrics* metrics_;
  std::shared_ptr<net::http::ResponseWriter> writer_;

  std::mutex mu_;
  std::vector<std::shared_ptr<UpstreamCall>> calls_;  // guarded by mu_; by image
  std::vector<Answer> answers_;                       // guarded by mu_; by image
  std::vector<int> encoder_of_;                       // guarded by mu_; by image
  std::vector<std::vector<Json>> items_;              // guarded by mu_; by image
  size_t num_pending_ = 0;                            // guarded by mu_
  int64_t started_ns_ = 0;                            // guarded by mu_
  bool finished_ = false;                             // guarded by mu_
};

}  // namespace

std::vector<ImagePart> find_image_parts(const Json& client_body) {
  std::vector<ImagePart> out;
  auto messages = client_body.find("messages");
  if (messages == client_body.end() || !messages->is_array()) {
    return out;
  }
  for (const auto& message : *messages) {
    if (!message.is_object()) {
      continue;
    }
    auto content = message.find("content");
    if (content == message.end() || !content->is_array()) {
      continue;
    }
    for (const auto& part : *content) {
      if (auto url = image_url_of(part)) {
        out.push_back({part, image_key(*url)});
      }
    }
  }
  return out;
}

std::string encoder_body(const Json& client_body, const Json& image_part) {
  Json j = Json::object();
  if (auto model = client_body.find("model"); model != client_body.end()) {
    j["model"] = *model;
  }
  j["messages"] = Json::array({Json{{"role", "user"}, {"content", Json::array({image_part})}}});
  j["max_tokens"] = 1;
  j["stream"] = false;
  return dump(j);
}

Result<std::vector<Json>> parse_encoder_items(std::string_view answer_body) {
  Json j = Json::parse(answer_body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return invalid_argument("the answer is not a JSON object");
  }
  auto params = j.find("ec_transfer_params");
  if (params == j.end() || !params->is_object()) {
    return invalid_argument("no ec_transfer_params object");
  }
  auto items = params->find("items");
  if (items == params->end() || !items->is_array() || items->empty()) {
    return invalid_argument("ec_transfer_params.items is not a non-empty array");
  }
  std::vector<Json> out;
  for (const auto& item : *items) {
    auto hash = item.is_object() ? item.find("mm_hash") : item.end();
    if (!item.is_object() || hash == item.end() || !hash->is_string()) {
      return invalid_argument("an item of ec_transfer_params.items has no string mm_hash");
    }
    out.push_back(item);
  }
  return out;
}

EncoderRouter::EncoderRouter(size_t num_encoders, size_t max_entries)
    : num_encoders_(num_encoders), max_entries_(max_entries) {}

EncoderRouter::Pick EncoderRouter::pick(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return {.encoder_index = it->second->second, .is_affinity = true};
  }
  int encoder = static_cast<int>(next_++ % num_encoders_);
  if (max_entries_ == 0) {
    return {.encoder_index = encoder, .is_affinity = false};
  }
  lru_.emplace_front(key, encoder);
  index_[key] = lru_.begin();
  if (lru_.size() > max_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return {.encoder_index = encoder, .is_affinity = false};
}

void EncoderRouter::forget(uint64_t key, int encoder_index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end() && it->second->second == encoder_index) {
    lru_.erase(it->second);
    index_.erase(it);
  }
}

size_t EncoderRouter::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

void start_encoder_stage(EncodePlan plan, UpstreamClient* upstream, ProxyMetrics* metrics,
                         std::shared_ptr<net::http::ResponseWriter> writer) {
  auto stage = std::make_shared<EncoderStage>(std::move(plan), metrics, std::move(writer));
  stage->start(upstream);
}

}  // namespace crescent::proxy
