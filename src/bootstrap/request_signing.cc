#include "bootstrap/request_signing.h"

#include <cstdlib>

#include "net/auth/auth_token.h"

namespace crescent::bootstrap {
namespace {

constexpr size_t kMaxNonces = 100'000;  // bounds memory under a flood of valid signatures

std::string signature(const std::string& token, std::string_view method, std::string_view target,
                      std::string_view body, std::string_view ts, std::string_view nonce) {
  std::string message = "crescent-v1 bootstrap\n";
  message.append(method).append("\n").append(target).append("\n").append(ts).append("\n");
  message.append(nonce).append("\n").append(
      net::auth::to_hex(net::auth::as_view(net::auth::sha256(body))));
  return net::auth::to_hex(net::auth::as_view(net::auth::hmac_sha256(token, message)));
}

// The value of `key=` in "a=1,b=2"; "" when absent.
std::string_view field(std::string_view params, std::string_view key) {
  size_t pos = 0;
  while (pos <= params.size()) {
    size_t end = params.find(',', pos);
    if (end == std::string_view::npos)
      end = params.size();
    std::string_view item = params.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ')
      item.remove_prefix(1);
    if (item.size() > key.size() && item.substr(0, key.size()) == key && item[key.size()] == '=')
      return item.substr(key.size() + 1);
    pos = end + 1;
  }
  return {};
}

}  // namespace

int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sign_request(const std::string& token, std::string_view method, std::string_view target,
                         std::string_view body, int64_t unix_seconds) {
  const std::string ts = std::to_string(unix_seconds);
  const std::string nonce = net::auth::to_hex(net::auth::random_bytes(16));
  std::string out(kSignatureScheme);
  out.append(" ts=").append(ts).append(",nonce=").append(nonce).append(",sig=");
  out.append(signature(token, method, target, body, ts, nonce));
  return out;
}

Status RequestVerifier::verify(std::string_view method, std::string_view target,
                               std::string_view body, std::string_view authorization,
                               int64_t unix_seconds) {
  if (authorization.empty()) {
    return permission_denied(
        "this bootstrap requires signed registrations (--auth-token-file); the request has no "
        "Authorization header");
  }
  if (authorization.size() <= kSignatureScheme.size() ||
      authorization.substr(0, kSignatureScheme.size()) != kSignatureScheme ||
      authorization[kSignatureScheme.size()] != ' ') {
    return permission_denied("Authorization is not a " + std::string(kSignatureScheme) +
                             " signature");
  }
  const std::string_view params = authorization.substr(kSignatureScheme.size() + 1);
  const std::string_view ts = field(params, "ts");
  const std::string_view nonce = field(params, "nonce");
  const std::string_view sig = field(params, "sig");
  if (ts.empty() || ts.size() > 19 || nonce.size() < 16 || nonce.size() > 64 || sig.size() != 64)
    return permission_denied("malformed Authorization signature (need ts, nonce and sig)");
  char* end = nullptr;
  const std::string ts_text(ts);
  const long long when = std::strtoll(ts_text.c_str(), &end, 10);
  if (end == nullptr || *end != '\0')
    return permission_denied("malformed Authorization timestamp");
  if (when < unix_seconds - window_s_ || when > unix_seconds + window_s_) {
    return permission_denied(
        "stale Authorization timestamp (" + std::to_string(when - unix_seconds) +
        " s from this server's clock; the window is +-" + std::to_string(window_s_) + " s)");
  }
  if (!net::auth::digests_equal(signature(token_, method, target, body, ts, nonce), sig))
    return permission_denied("wrong Authorization signature (another token?)");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = seen_nonces_.begin(); it != seen_nonces_.end();) {
    it = it->second < unix_seconds ? seen_nonces_.erase(it) : std::next(it);
  }
  if (seen_nonces_.size() >= kMaxNonces)
    return permission_denied("too many signed requests in the replay window; retry later");
  if (!seen_nonces_.emplace(std::string(nonce), when + window_s_).second)
    return permission_denied("replayed Authorization nonce");
  return Status::ok();
}

}  // namespace crescent::bootstrap
