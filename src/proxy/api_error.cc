#include "proxy/api_error.h"

#include <nlohmann/json.hpp>

namespace crescent::proxy {
namespace {

// In OpenAI's key order.
nlohmann::ordered_json error_json(int http_status, std::string_view message,
                                  std::string_view type) {
  return {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", http_status}}}};
}

std::string dump(const nlohmann::ordered_json& j) {
  // Upstream text may hold invalid UTF-8; replace it rather than throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

std::string error_body(int http_status, std::string_view message, std::string_view type) {
  return dump(error_json(http_status, message, type));
}

std::string_view error_type_for(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 503:
      return "service_unavailable";
    case 504:
      return "timeout";
    default:
      return http_status < 500 ? "invalid_request_error" : "upstream_error";
  }
}

std::string sse_error_events(int http_status, std::string_view message) {
  return "data: " + dump(error_json(http_status, message, error_type_for(http_status))) +
         "\n\ndata: [DONE]\n\n";
}

std::string upstream_error_message(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return e["message"].get<std::string>();
    }
    if (e.is_string()) {
      return e.get<std::string>();
    }
  }
  if (j.is_object() && j.contains("detail") && j["detail"].is_string()) {  // FastAPI's shape
    return j["detail"].get<std::string>();
  }
  constexpr size_t kMax = 500;
  std::string text = body.substr(0, kMax);
  if (body.size() > kMax) {
    text += "...";
  }
  return text.empty() ? "(empty body)" : text;
}

bool is_openai_error(std::string_view body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("error") && j["error"].is_object();
}

}  // namespace crescent::proxy
