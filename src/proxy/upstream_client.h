#pragma once
// An asynchronous HTTP/1.1 client for the proxy's calls to prefill and decode servers
// (Boost.Asio/Beast): many calls in flight on a few I/O threads, keep-alive connections pooled
// per upstream and reused, a response body handed over piece by piece as it arrives (nothing
// is buffered), and cancel() that closes the connection at once, which is how an upstream
// server learns that its request was abandoned.
//
// Thread-safety: UpstreamClient::start() and UpstreamCall::cancel() may be called from any
// thread and never block. A call's callbacks run on the client's I/O threads, one at a time and
// in order (on_headers, on_data..., on_done), never after on_done; they must not block.
// The client must be destroyed from a thread that is not one of its I/O threads.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "net/http/http_message.h"

namespace crescent::proxy {

struct UpstreamCore;  // upstream_client.cc

struct UpstreamRequest {
  std::string method = "POST";
  std::string target;          // "/v1/completions"
  net::http::Headers headers;  // sent as spelled here
  std::string body;
};

struct UpstreamCallbacks {
  // The status line and headers (names lower-cased) arrived.
  std::function<void(int status, const net::http::Headers& headers)> on_headers;
  // One piece of the body, decoded from chunked encoding, as it arrived.
  std::function<void(std::string data)> on_data;
  // Runs exactly once. OK: the whole response was read. Unavailable: cannot connect, or the
  // connection broke (the message says which and names the upstream). DeadlineExceeded: the
  // call's deadline passed. Cancelled: cancel() was called first.
  std::function<void(Status status)> on_done;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Closes the connection and ends the call with Cancelled, unless it has already ended.
  virtual void cancel() = 0;
};

struct UpstreamClientOptions {
  int num_io_threads = 2;
  // Idle keep-alive connections kept per upstream; more are closed.
  size_t max_idle_connections_per_upstream = 1024;
  // An idle connection older than this is closed instead of reused (servers close idle
  // connections on their own timer; crescent serve after 60 s).
  int64_t max_idle_ms = 30'000;
  // Connecting gives up after this (or at the call's deadline, whichever is first).
  int64_t connect_timeout_ms = 10'000;
};

class UpstreamClient {
 public:
  explicit UpstreamClient(UpstreamClientOptions options = {});
  ~UpstreamClient();  // shutdown()
  // Cancels every call in flight (each gets its on_done), refuses new ones (they end with
  // Cancelled) and joins the I/O threads. Idempotent; stats() still works after it.
  void shutdown();
  UpstreamClient(const UpstreamClient&) = delete;
  UpstreamClient& operator=(const UpstreamClient&) = delete;

  // Starts one request to http://host:port. A kept-alive connection is reused when one is
  // idle; if it turns out the server had closed it before answering anything, the request is
  // sent once more on a fresh connection.
  std::shared_ptr<UpstreamCall> start(const std::string& host, int port, UpstreamRequest request,
                                      UpstreamCallbacks callbacks, Deadline deadline);

  struct Stats {
    int64_t num_connects = 0;  // connections opened
    int64_t num_reuses = 0;    // requests sent on a kept-alive connection
    int num_idle = 0;          // connections idle in the pool now
    int num_in_flight = 0;     // calls not ended yet
  };
  Stats stats() const;

 private:
  std::shared_ptr<UpstreamCore> core_;
  std::vector<std::thread> threads_;
};

}  // namespace crescent::proxy
