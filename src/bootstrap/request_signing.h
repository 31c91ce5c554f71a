#pragma once
// Signed bootstrap requests (--auth-token-file): with a token, a worker's POST /register (first
// registration and every lease renewal) carries
//   Authorization: Crescent-HMAC-SHA256 ts=<unix s>,nonce=<32 hex>,sig=<64 hex>
// where sig = hex(HMAC-SHA256(token, "crescent-v1 bootstrap\n" METHOD "\n" TARGET "\n" ts "\n"
// nonce "\n" hex(SHA-256(body)))). The token never crosses the wire; a captured header is useless
// for another body or path, and the server refuses timestamps off by more than the window and
// nonces it has already seen inside it (replays). vLLM's workers send no header: a bootstrap
// without a token accepts them as before.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/status.h"

namespace crescent::bootstrap {

inline constexpr std::string_view kSignatureScheme = "Crescent-HMAC-SHA256";

// The Authorization header value for one request, signed at `unix_seconds`.
std::string sign_request(const std::string& token, std::string_view method, std::string_view target,
                         std::string_view body, int64_t unix_seconds);
int64_t unix_seconds_now();

// Checks signed requests. Thread-safe (the replay cache has its own mutex).
class RequestVerifier {
 public:
  RequestVerifier(std::string token, std::chrono::seconds window = std::chrono::seconds(60))
      : token_(std::move(token)), window_s_(window.count()) {}

  // PermissionDenied (Unauthenticated in HTTP terms: the caller answers 401) with the reason:
  // header missing, malformed, stale or future timestamp, replayed nonce, wrong signature.
  Status verify(std::string_view method, std::string_view target, std::string_view body,
                std::string_view authorization, int64_t unix_seconds);

 private:
  const std::string token_;
  const int64_t window_s_;
  std::mutex mu_;
  std::unordered_map<std::string, int64_t> seen_nonces_;  // GUARDED_BY(mu_): nonce -> expiry
};

}  // namespace crescent::bootstrap
