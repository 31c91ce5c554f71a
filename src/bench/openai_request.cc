#include "bench/openai_request.h"

#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>

#include "bench/stream_recorder.h"
#include "core/check.h"
#include "core/clock.h"

namespace crescent::bench {

using json = nlohmann::json;

namespace {

// The OpenAI error message of a non-2xx body, else the start of the body.
std::string error_message_of(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object() && e->contains("message") && (*e)["message"].is_string()) {
      return (*e)["message"].get<std::string>();
    }
    if (e != j.end() && e->is_string()) {
      return e->get<std::string>();
    }
  }
  return body.size() > 300 ? body.substr(0, 300) + "..." : body;
}

}  // namespace

std::string ServerAddress::url() const {
  return "http://" + host + ":" + std::to_string(port) + path_prefix;
}

Result<ServerAddress> parse_base_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return invalid_argument("--base-url must start with http:// (https is not supported), got '" +
                            std::string(url) + "'");
  }
  std::string_view rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  ServerAddress address;
  if (slash != std::string_view::npos) {
    address.path_prefix = std::string(rest.substr(slash));
    while (!address.path_prefix.empty() && address.path_prefix.back() == '/') {
      address.path_prefix.pop_back();
    }
  }
  std::string_view host = authority;
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return invalid_argument("bad IPv6 address in --base-url '" + std::string(url) + "'");
    }
    host = authority.substr(1, close - 1);
    authority.remove_prefix(close + 1);
    if (!authority.empty() && authority.front() != ':') {
      return invalid_argument("bad --base-url '" + std::string(url) + "'");
    }
  } else {
    size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    authority = colon == std::string_view::npos ? std::string_view() : authority.substr(colon);
  }
  if (host.empty()) {
    return invalid_argument("--base-url '" + std::string(url) + "' has no host");
  }
  address.host = std::string(host);
  if (!authority.empty()) {
    std::string_view digits = authority.substr(1);
    int port = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (ec != std::errc() || end != digits.data() + digits.size() || port <= 0 || port > 65535) {
      return invalid_argument("bad port in --base-url '" + std::string(url) + "'");
    }
    address.port = port;
  }
  return address;
}

std::string request_body(const SampleRequest& request, const RequestOptions& options) {
  json body;
  body["model"] = options.model;
  CRESCENT_CHECK(options.is_chat || request.image_urls.empty())
      << "images go only to the chat endpoint (validate() refuses the rest)";
  if (options.is_chat) {
    json content = request.prompt;
    if (!request.image_urls.empty()) {
      // vLLM's order: the text part, then the images.
      content = json::array({{{"type", "text"}, {"text", request.prompt}}});
      for (const std::string& url : request.image_urls) {
        content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
      }
    }
    body["messages"] = json::array({{{"role", "user"}, {"content", std::move(content)}}});
    body["max_completion_tokens"] = request.expected_output_len;
  } else {
    body["prompt"] = request.prompt;
    body["max_tokens"] = request.expected_output_len;
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) {
    body["ignore_eos"] = true;
  }
  json extra = json::parse(options.extra_body_json, nullptr, /*allow_exceptions=*/false);
  if (extra.is_object()) {
    body.update(extra);
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

double steady_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

RequestOutput send_request(net::http::HttpClient& client, const SampleRequest& request,
                           const RequestOptions& options, const std::string& request_id) {
  RequestOutput out;
  out.prompt_len = request.prompt_len;
  out.num_images = static_cast<int64_t>(request.image_urls.size());
  net::http::Headers headers = options.extra_headers;
  headers["content-type"] = "application/json";
  headers["x-request-id"] = request_id;
  std::string body = request_body(request, options);
  auto deadline = Deadline::after(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(options.timeout_s)));

  double start_s = steady_seconds();
  out.start_time_s = start_s;
  StreamRecorder recorder(options.is_chat, start_s);
  net::http::SseParser sse;
  // The status is known only when stream() returns: keep the start of the body in case it is
  // an error document, and time the events in case it is the stream.
  std::string body_start;
  auto response = client.stream(
      "POST", options.path, std::move(body), std::move(headers),
      [&](std::string_view data) {
        double now_s = steady_seconds();
        constexpr size_t kMaxKept = 64 << 10;
        if (body_start.size() < kMaxKept) {
          body_start.append(data.substr(0, kMaxKept - body_start.size()));
        }
        sse.feed(data, [&](std::string_view event) { recorder.on_event(event, now_s); });
        return !recorder.has_failed();
      },
      deadline);
  if (!response.is_ok()) {
    recorder.finish(&out);
    out.success = false;
    out.error = response.status().to_string();
    return out;
  }
  if (response->status != 200) {
    out.success = false;
    out.error = "HTTP " + std::to_string(response->status) + " " +
                std::string(net::http::reason_phrase(response->status)) + ": " +
                error_message_of(body_start);
    return out;
  }
  recorder.finish(&out);
  return out;
}

}  // namespace crescent::bench
