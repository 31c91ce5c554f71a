#pragma once
// vLLM's --api-key for an HTTP server: every path except a few open ones (health checks and
// metrics, which load balancers and Prometheus scrape without credentials) needs the header
// `Authorization: Bearer KEY`. The key is compared in constant time (in the key's length and
// content; only the presented token's length shows in the timing), and never appears in a
// message. Immutable; thread-safe.

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "net/http/http_message.h"

namespace crescent::net::http {

class ApiKeyCheck {
 public:
  // No key: every request is allowed.
  ApiKeyCheck() = default;
  // InvalidArgument when the key is empty or has characters that cannot travel in an HTTP
  // header token (anything but visible ASCII): it could never be matched.
  static Result<ApiKeyCheck> make(std::string key);

  bool is_enabled() const { return !key_.empty(); }

  // Paths reachable without the key: /health, /metrics, /version, /ping.
  static bool is_open_path(std::string_view path);

  // nullopt when `request` may proceed; else why not, for the 401's message (no key in it).
  std::optional<std::string> refusal(const Request& request) const;

 private:
  explicit ApiKeyCheck(std::string key) : key_(std::move(key)) {}
  std::string key_;
};

// Equal in content and length, in time that does not depend on where they first differ nor
// on `expected`'s length.
bool constant_time_equals(std::string_view expected, std::string_view presented);

// The response headers of a 401 (RFC 6750): WWW-Authenticate: Bearer.
Headers unauthorized_headers();

}  // namespace crescent::net::http
