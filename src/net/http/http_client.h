#pragma once
// A blocking HTTP/1.1 client over one keep-alive connection (Boost.Beast), for tests,
// benchmarks and the proxy's control calls. Every call takes a Deadline and fails with
// DeadlineExceeded past it. stream() hands the body to a callback piece by piece as it
// arrives, which is how Server-Sent Events are consumed.
// Not thread-safe: use one HttpClient per thread.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/status.h"
#include "net/http/http_message.h"

namespace crescent::net::http {

class HttpClient {
 public:
  HttpClient(std::string host, int port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends one request and reads the whole response. Connects (or reconnects after the server
  // closed the previous connection) as needed. A non-2xx status is not an error.
  Result<Response> request(std::string_view method, std::string_view target, std::string body,
                           Headers headers, Deadline deadline);

  // Like request(), but calls on_data with each piece of the body as it arrives (decoded from
  // chunked encoding) instead of collecting it; on_data returns false to stop early, which
  // closes the connection. The returned Response has status and headers and an empty body.
  Result<Response> stream(std::string_view method, std::string_view target, std::string body,
                          Headers headers, const std::function<bool(std::string_view)>& on_data,
                          Deadline deadline);

  // Closes the connection (the next call reconnects).
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits a Server-Sent Events byte stream into the `data:` payloads of its events.
class SseParser {
 public:
  // Feeds bytes; calls on_event(data) for each complete event (multi-line data joined by '\n').
  void feed(std::string_view bytes, const std::function<void(std::string_view)>& on_event);

 private:
  std::string pending_;
};

}  // namespace crescent::net::http
