#pragma once
// One benchmark request to an OpenAI-compatible server: the streamed body vLLM's bench sends
// (/v1/completions with "prompt" and "max_tokens", or /v1/chat/completions with one user
// message and "max_completion_tokens", the message's content a list of a text part and
// image_url parts when the request has images; stream=true with usage), sent over HttpClient and
// timed by StreamRecorder. Failures (connection, HTTP status, error event, bad stream) come
// back in RequestOutput with a message, never as a Status.

#include <string>
#include <string_view>

#include "bench/dataset.h"
#include "bench/request_output.h"
#include "core/status.h"
#include "net/http/http_client.h"
#include "net/http/http_message.h"

namespace crescent::bench {

// Where requests go, from --base-url or --host/--port.
struct ServerAddress {
  std::string host;
  int port = 80;
  std::string path_prefix;  // "" or "/prefix" (no trailing slash)

  std::string url() const;  // "http://host:port/prefix"
};
// Accepts "http://host[:port][/prefix]"; InvalidArgument for anything else (https included).
Result<ServerAddress> parse_base_url(std::string_view url);

struct RequestOptions {
  std::string path;  // path_prefix + endpoint, e.g. "/v1/completions"
  bool is_chat = false;
  std::string model;
  bool ignore_eos = false;
  std::string extra_body_json = "{}";  // a JSON object merged into every body (sampling)
  net::http::Headers extra_headers;
  double timeout_s = 3600;
};

// The JSON body for one request.
std::string request_body(const SampleRequest& request, const RequestOptions& options);

// Seconds on the steady clock (the clock every RequestOutput time uses).
double steady_seconds();

// Sends one request on `client` and measures it; start_time_s is when it was sent.
RequestOutput send_request(net::http::HttpClient& client, const SampleRequest& request,
                           const RequestOptions& options, const std::string& request_id);

}  // namespace crescent::bench
