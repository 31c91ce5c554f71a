#include "proxy/completion_relay.h"

#include <atomic>
#include <mutex>

#include "core/logging.h"
#include "proxy/api_error.h"

namespace crescent::proxy {
namespace {

constexpr size_t kMaxErrorBodyBytes = 64 << 10;

bool is_success(int status) {
  return status >= 200 && status < 300;
}

class CompletionRelay : public std::enable_shared_from_this<CompletionRelay> {
 public:
  CompletionRelay(RelayPlan plan, ProxyMetrics* metrics,
                  std::shared_ptr<net::http::ResponseWriter> writer)
      : plan_(std::move(plan)), metrics_(metrics), writer_(std::move(writer)) {
    metrics_->add_in_flight(1);
  }

  ~CompletionRelay() {
    if (!finished_) {  // only when the upstream client shut down under it
      metrics_->add_in_flight(-1);
    }
    end_prefill();
    if (plan_.on_released) {
      plan_.on_released();
    }
  }

  void start(UpstreamClient* upstream) {
    // Registered before taking mu_: on_close runs fn at once if the client is already gone.
    writer_->on_close([weak = weak_from_this()] {
      if (auto self = weak.lock()) {
        self->on_client_closed();
      }
    });
    auto self = shared_from_this();
    // Held while both calls start, so no callback sees a call pointer not yet stored.
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {
      return;  // the client left before anything was sent
    }
    if (plan_.has_prefill) {
      prefill_call_ = upstream->start(
          plan_.prefill.host, plan_.prefill.port, std::move(plan_.prefill_request),
          {.on_headers = [self](int status,
                                const net::http::Headers&) { self->on_prefill_headers(status); },
           .on_data = [self](std::string data) { self->on_prefill_data(std::move(data)); },
           .on_done = [self](Status s) { self->on_prefill_done(std::move(s)); }},
          plan_.deadline);
    }
    decode_call_ = upstream->start(
        plan_.decode.host, plan_.decode.port, std::move(plan_.decode_request),
        {.on_headers =
             [self](int status, const net::http::Headers& headers) {
               self->on_decode_headers(status, headers);
             },
         .on_data = [self](std::string data) { self->on_decode_data(std::move(data)); },
         .on_done = [self](Status s) { self->on_decode_done(std::move(s)); }},
        plan_.deadline);
  }

 private:
  double seconds_since_arrival() const {
    return static_cast<double>(now_ns() - plan_.arrival_ns) * 1e-9;
  }

  net::http::Headers response_headers() const { return {{"X-Request-Id", plan_.request_id}}; }

  // Marks the client's answer complete (or abandoned) and counts it. Called before the last
  // bytes go to the client, so that /metrics read after a response includes it. Under mu_.
  void finish_locked(Outcome outcome) {
    finished_ = true;
    metrics_->count_request(plan_.endpoint, outcome);
    metrics_->add_in_flight(-1);
  }

  // Answers the client with an error: a whole response if nothing was sent yet, else an SSE
  // error event and [DONE] ending the stream. Under mu_.
  void fail_locked(int http_status, const std::string& message, Outcome outcome) {
    if (finished_) {
      return;
    }
    CRESCENT_LOG(kWarn) << "proxy: request " << plan_.request_id << ": " << message;
    finish_locked(outcome);
    if (client_stream_started_) {
      writer_->write(sse_error_events(http_status, message));
      writer_->end();
    } else {
      metrics_->observe_time_to_first_byte(seconds_since_arrival());
      writer_->send(http_status, "application/json",
                    error_body(http_status, message, error_type_for(http_status)),
                    response_headers());
    }
  }

  void cancel_prefill_locked() {
    if (prefill_call_) {
      prefill_call_->cancel();
    }
  }
  void cancel_decode_locked() {
    if (decode_call_) {
      decode_call_->cancel();
    }
  }

  // --- the client

  void on_client_closed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {
      return;
    }
    CRESCENT_LOG(kInfo) << "proxy: request " << plan_.request_id
                        << ": the client went away; closing the upstream connections";
    finish_locked(Outcome::kClientDisconnected);
    cancel_prefill_locked();
    cancel_decode_locked();
  }

  // --- the prefill server: its answer is discarded unless it is an error

  void on_prefill_headers(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_status_ = status;
  }

  void on_prefill_data(std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!is_success(prefill_status_) && prefill_body_.size() < kMaxErrorBodyBytes) {
      prefill_body_ += data;
    }
  }

  void end_prefill() {
    if (plan_.on_prefill_ended && !prefill_ended_.exchange(true)) {
      plan_.on_prefill_ended();
    }
  }

  void on_prefill_done(Status status) {
    end_prefill();
    std::lock_guard<std::mutex> lock(mu_);
    prefill_call_.reset();
    if (status.is_ok() && is_success(prefill_status_)) {
      metrics_->observe_prefill(seconds_since_arrival());
      return;
    }
    if (status.code() == StatusCode::kCancelled) {
      return;  // the proxy gave up on it
    }
    metrics_->count_upstream_error(UpstreamSide::kPrefill);
    if (!status.is_ok() && status.code() == StatusCode::kUnavailable && prefill_status_ == 0 &&
        plan_.on_prefill_unreachable) {
      plan_.on_prefill_unreachable(status);
    }
    std::string what = status.is_ok() ? "answered " + std::to_string(prefill_status_) + ": " +
                                            upstream_error_message(prefill_body_)
                                      : status.message();
    if (finished_) {
      return;
    }
    if (client_stream_started_) {
      // The decode server already produces the answer (it has the KV, or it will report its
      // own transfer failure): let it finish.
      CRESCENT_LOG(kWarn) << "proxy: request " << plan_.request_id << ": prefill "
                          << plan_.prefill.url << " failed after decoding began (" << what
                          << "); the decode goes on";
      return;
    }
    cancel_decode_locked();
    if (status.code() == StatusCode::kDeadlineExceeded) {
      return fail_locked(504, "request timed out waiting for prefill " + plan_.prefill.url,
                         Outcome::kTimeout);
    }
    int http_status = status.is_ok() ? prefill_status_ : 502;
    fail_locked(http_status, "prefill " + plan_.prefill.url + " failed: " + what,
                Outcome::kPrefillError);
  }

  // --- the decode server: its answer is the client's

  void on_decode_headers(int status, const net::http::Headers& headers) {
    std::lock_guard<std::mutex> lock(mu_);
    decode_status_ = status;
    auto it = headers.find("content-type");
    decode_content_type_ = it == headers.end() ? "application/json" : it->second;
    decode_is_stream_ =
        is_success(status) && decode_content_type_.rfind("text/event-stream", 0) == 0;
  }

  void on_decode_data(std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {
      return;
    }
    if (decode_is_stream_) {
      if (!client_stream_started_) {
        start_client_stream_locked();
      }
      writer_->write(std::move(data));
      return;
    }
    // A whole response (or an error) goes to the client whole, once complete.
    decode_body_ += data;
    if (decode_body_.size() > plan_.max_buffered_response_bytes) {
      cancel_decode_locked();
      cancel_prefill_locked();
      metrics_->count_upstream_error(UpstreamSide::kDecode);
      fail_locked(502,
                  plan_.decode_role + " " + plan_.decode.url + " answered more than " +
                      std::to_string(plan_.max_buffered_response_bytes) + " bytes",
                  Outcome::kDecodeError);
    }
  }

  void start_client_stream_locked() {
    client_stream_started_ = true;
    metrics_->observe_time_to_first_byte(seconds_since_arrival());
    auto headers = response_headers();
    headers["Cache-Control"] = "no-cache";
    writer_->start_stream(decode_status_, decode_content_type_, std::move(headers));
  }

  void on_decode_done(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    decode_call_.reset();
    if (finished_) {
      return;
    }
    if (status.is_ok() && is_success(decode_status_)) {
      finish_locked(Outcome::kOk);
      if (decode_is_stream_) {
        if (!client_stream_started_) {
          start_client_stream_locked();
        }
        writer_->end();
      } else {
        metrics_->observe_time_to_first_byte(seconds_since_arrival());
        writer_->send(decode_status_, decode_content_type_, std::move(decode_body_),
                      response_headers());
      }
      return;
    }
    metrics_->count_upstream_error(UpstreamSide::kDecode);
    const bool is_server_side_failure = !status.is_ok() || decode_status_ >= 500;
    if (prefill_call_ && is_server_side_failure && plan_.on_prefill_abandoned) {
      plan_.on_prefill_abandoned();
    }
    cancel_prefill_locked();
    if (!status.is_ok() && status.code() == StatusCode::kUnavailable && decode_status_ == 0 &&
        plan_.on_decode_unreachable) {
      plan_.on_decode_unreachable(status);
    }
    if (status.is_ok()) {
      // The decode server's own error: its status, and its body when OpenAI-shaped.
      CRESCENT_LOG(kWarn) << "proxy: request " << plan_.request_id << ": " << plan_.decode_role
                          << " " << plan_.decode.url << " answered " << decode_status_;
      metrics_->observe_time_to_first_byte(seconds_since_arrival());
      finish_locked(Outcome::kDecodeError);
      if (is_openai_error(decode_body_)) {
        writer_->send(decode_status_, "application/json", std::move(decode_body_),
                      response_headers());
      } else {
        writer_->send(decode_status_, "application/json",
                      error_body(decode_status_,
                                 plan_.decode_role + " " + plan_.decode.url + " answered " +
                                     std::to_string(decode_status_) + ": " +
                                     upstream_error_message(decode_body_),
                                 error_type_for(decode_status_)),
                      response_headers());
      }
      return;
    }
    if (status.code() == StatusCode::kDeadlineExceeded) {
      return fail_locked(504,
                         std::string("request timed out") +
                             (client_stream_started_ ? " while streaming from " : " waiting for ") +
                             plan_.decode_role + " " + plan_.decode.url,
                         Outcome::kTimeout);
    }
    fail_locked(502, plan_.decode_role + " " + plan_.decode.url + " failed: " + status.message(),
                Outcome::kDecodeError);
  }

  RelayPlan plan_;
  ProxyMetrics* metrics_;
  std::shared_ptr<net::http::ResponseWriter> writer_;

  std::mutex mu_;
  std::shared_ptr<UpstreamCall> prefill_call_;  // guarded by mu_; null once ended
  std::shared_ptr<UpstreamCall> decode_call_;   // guarded by mu_; null once ended
  bool finished_ = false;                       // guarded by mu_: the client's answer is done
  std::atomic<bool> prefill_ended_{false};      // on_prefill_ended ran
  bool client_stream_started_ = false;          // guarded by mu_
  int prefill_status_ = 0;                      // guarded by mu_
  std::string prefill_body_;                    // guarded by mu_; kept only for an error
  int decode_status_ = 0;                       // guarded by mu_
  std::string decode_content_type_;             // guarded by mu_
  bool decode_is_stream_ = false;               // guarded by mu_
  std::string decode_body_;                     // guarded by mu_; whole responses and errors
};

}  // namespace

void start_completion_relay(RelayPlan plan, UpstreamClient* upstream, ProxyMetrics* metrics,
                            std::shared_ptr<net::http::ResponseWriter> writer) {
  auto relay = std::make_shared<CompletionRelay>(std::move(plan), metrics, std::move(writer));
  relay->start(upstream);
}

}  // namespace crescent::proxy
