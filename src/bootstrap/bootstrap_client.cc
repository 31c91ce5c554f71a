// One HTTP connection per call: registration and queries are rare (start-up, first request
// for an engine), so there is nothing to gain from pooling and nothing to go stale.

#include "bootstrap/bootstrap_client.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "bootstrap/etcd_client.h"
#include "bootstrap/etcd_registry.h"
#include "bootstrap/request_signing.h"
#include "bootstrap/wire.h"
#include "core/logging.h"
#include "net/http/http_client.h"

namespace crescent::bootstrap {
namespace {

constexpr int64_t kFirstBackoffMs = 100;
constexpr int64_t kMaxBackoffMs = 2000;
// One attempt of register_with_retry gives up after this long, so a hung server costs a retry
// rather than the whole deadline.
constexpr int64_t kAttemptTimeoutMs = 5000;

Deadline earlier(Deadline a, Deadline b) {
  return a.when() < b.when() ? a : b;
}

Result<net::http::Response> call(const std::string& url, std::string_view method,
                                 std::string_view target, std::string body, Deadline deadline,
                                 const std::string& auth_token = {}) {
  ASSIGN_OR_RETURN(auto host_port, parse_http_url(url));
  net::http::HttpClient client(host_port.first, host_port.second);
  net::http::Headers headers;
  if (!body.empty()) {
    headers["Content-Type"] = "application/json";
  }
  if (!auth_token.empty()) {
    headers["Authorization"] = sign_request(auth_token, method, target, body, unix_seconds_now());
  }
  auto response = client.request(method, target, std::move(body), headers, deadline);
  if (!response.is_ok()) {
    return response.status().with_context("bootstrap " + std::string(method) + " " + url +
                                          std::string(target));
  }
  return response;
}

// A non-200 answer as a Status: 503 and other 5xx may pass (Unavailable); 4xx will not.
Status status_of(const net::http::Response& response, const std::string& what) {
  ErrorBody error = parse_error_json(response.body);
  std::string message =
      what + " answered " + std::to_string(response.status) + ": " + error.message;
  if (response.status >= 500) {
    return unavailable(message);
  }
  if (error.code == "registration_conflict" || error.code == "registration_fenced") {
    return already_exists(message);
  }
  if (response.status == 404 || response.status == 405) {
    return failed_precondition(message + " (is this a bootstrap server?)");
  }
  return invalid_argument(message);
}

}  // namespace

Status register_worker(const std::string& url, const WorkerRegistration& registration,
                       Deadline deadline) {
  if (is_etcd_url(url)) {
    return etcd_register_worker(url, registration, deadline);
  }
  ASSIGN_OR_RETURN(Renewal renewal, renew_registration(url, registration, deadline));
  if (renewal.is_fenced) {
    return already_exists(renewal.fenced_reason);
  }
  return Status::ok();
}

Result<Renewal> renew_registration(const std::string& url, const WorkerRegistration& registration,
                                   Deadline deadline) {
  if (is_etcd_url(url)) {
    return etcd_renew_registration(url, registration, deadline);
  }
  const std::string what = "bootstrap POST " + url + "/register";
  ASSIGN_OR_RETURN(auto response, call(url, "POST", "/register", registration_json(registration),
                                       deadline, registration.auth_token));
  Renewal renewal;
  if (response.status == 409 && parse_error_json(response.body).code == "registration_fenced") {
    renewal.is_fenced = true;
    renewal.fenced_reason = parse_error_json(response.body).message;
    return renewal;
  }
  if (response.status != 200) {
    return status_of(response, what);
  }
  renewal.granted = parse_registered_json(response.body);
  return renewal;
}

Result<QueryResult> query(const std::string& url, Deadline deadline) {
  if (is_etcd_url(url)) {
    return etcd_query(url, deadline);
  }
  const std::string what = "bootstrap GET " + url + "/query";
  ASSIGN_OR_RETURN(auto response, call(url, "GET", "/query", "", deadline));
  if (response.status != 200) {
    return status_of(response, what);
  }
  auto parsed = parse_query_json(response.body);
  if (!parsed.is_ok()) {
    return parsed.status().with_context(what);
  }
  return parsed;
}

Result<EncoderTable> query_encoders(const std::string& url, Deadline deadline) {
  if (is_etcd_url(url)) {
    return etcd_query_encoders(url, deadline);
  }
  const std::string what = "bootstrap GET " + url + "/query?role=encode";
  ASSIGN_OR_RETURN(auto response, call(url, "GET", "/query?role=encode", "", deadline));
  if (response.status != 200) {
    return status_of(response, what);
  }
  auto parsed = parse_encoders_json(response.body);
  if (!parsed.is_ok()) {
    return parsed.status().with_context(what);
  }
  return parsed;
}

Status register_with_retry(const std::string& url, const WorkerRegistration& registration,
                           Deadline deadline) {
  RETURN_IF_ERROR(check_bootstrap_url(url));
  int64_t backoff_ms = kFirstBackoffMs;
  int num_attempts = 0;
  Status last;
  auto gave_up = [&] {
    return deadline_exceeded("registering engine '" + registration.engine_id + "' " +
                             (registration.role.empty()
                                  ? "dp " + std::to_string(registration.dp_rank)
                                  : "(role " + registration.role + ")") +
                             " with " + url + " failed after " + std::to_string(num_attempts) +
                             " attempt(s); last: " + last.to_string());
  };
  while (true) {
    ++num_attempts;
    last = register_worker(url, registration,
                           earlier(deadline, Deadline::after_ms(kAttemptTimeoutMs)));
    bool may_pass =
        last.code() == StatusCode::kUnavailable || last.code() == StatusCode::kDeadlineExceeded;
    if (last.is_ok() || !may_pass) {
      return last;
    }
    if (deadline.is_expired()) {
      return gave_up();
    }
    if (num_attempts == 1) {
      // Said once, so that a worker waiting for a bootstrap server that is not up does not
      // look hung.
      CRESCENT_LOG(kWarn)
          << "bootstrap: cannot register with " << url << " yet (" << last.message()
          << "); retrying for up to "
          << std::chrono::duration_cast<std::chrono::seconds>(deadline.remaining()).count() << " s";
    } else {
      CRESCENT_LOG(kDebug) << "bootstrap: " << last.to_string() << "; retrying in " << backoff_ms
                           << " ms";
    }
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
        std::chrono::milliseconds(backoff_ms), deadline.remaining()));
    if (deadline.is_expired()) {
      return gave_up();
    }
    backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  }
}

}  // namespace crescent::bootstrap
