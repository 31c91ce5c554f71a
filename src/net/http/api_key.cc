#include "net/http/api_key.h"

#include <cctype>

namespace crescent::net::http {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

bool is_bearer_scheme(std::string_view scheme) {
  constexpr std::string_view kBearer = "bearer";
  if (scheme.size() != kBearer.size()) {
    return false;
  }
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(scheme[i])) != kBearer[i]) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<ApiKeyCheck> ApiKeyCheck::make(std::string key) {
  if (key.empty()) {
    return invalid_argument("the API key is empty");
  }
  for (char c : key) {
    if (c <= 0x20 || c >= 0x7f) {
      return invalid_argument(
          "the API key may hold only visible ASCII characters (no spaces or control "
          "characters), since it travels in an HTTP header");
    }
  }
  return ApiKeyCheck(std::move(key));
}

bool ApiKeyCheck::is_open_path(std::string_view path) {
  return path == "/health" || path == "/metrics" || path == "/version" || path == "/ping";
}

std::optional<std::string> ApiKeyCheck::refusal(const Request& request) const {
  if (!is_enabled() || is_open_path(request.path)) {
    return std::nullopt;
  }
  auto it = request.headers.find("authorization");
  if (it == request.headers.end()) {
    return "this server needs an API key: send the header 'Authorization: Bearer <key>'";
  }
  const std::string_view value = trim(it->second);
  const size_t space = value.find(' ');
  if (space == std::string_view::npos || !is_bearer_scheme(value.substr(0, space))) {
    return "the Authorization header must use the Bearer scheme: 'Authorization: Bearer <key>'";
  }
  if (!constant_time_equals(key_, trim(value.substr(space + 1)))) {
    return "invalid API key";
  }
  return std::nullopt;
}

bool constant_time_equals(std::string_view expected, std::string_view presented) {
  // Walks the presented token once whatever it holds; the expected key is read cyclically so
  // that neither its length nor its content changes the number of steps.
  unsigned diff = expected.size() == presented.size() ? 0u : 1u;
  if (expected.empty()) {
    return presented.empty();
  }
  for (size_t i = 0; i < presented.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i % expected.size()]) ^
            static_cast<unsigned char>(presented[i]);
  }
  return diff == 0;
}

Headers unauthorized_headers() {
  return {{"WWW-Authenticate", "Bearer"}};
}

}  // namespace crescent::net::http
