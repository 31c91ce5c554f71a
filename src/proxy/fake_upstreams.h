#pragma once
// Test doubles for the proxy's upstreams, on the real HTTP server (127.0.0.1, any free port):
// a FakeServer that records every request and answers with a handler the test chooses, and
// handlers that play a prefill server, its bootstrap server, a decode server and an encoder. For
// the proxy's unit tests and the multi-process tests in tests/proxy; no model needed.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/http/http_server.h"
#include "net/socket.h"

namespace crescent::proxy::testing {

// A one-shot latch with a bounded wait: tests must never hang.
class Gate {
 public:
  void open();
  bool is_open() const;
  // True if opened within timeout_ms.
  bool wait(int64_t timeout_ms) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

struct CapturedRequest {
  std::string method;
  std::string path;
  net::http::Headers headers;  // lower-case names
  std::string body;
  int64_t arrival_ns = 0;
  std::string header(const std::string& name) const;
};

class FakeServer {
 public:
  using Handler = std::function<void(const net::http::Request& request,
                                     std::shared_ptr<net::http::ResponseWriter> writer)>;
  // Starts listening at once (on `port`, or any free port when 0: a server that comes back
  // after stop() listens on the port it had); aborts the test binary if it cannot.
  explicit FakeServer(Handler handler, int num_io_threads = 4, int port = 0);
  ~FakeServer();  // stops, then joins the threads started with spawn()

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_handler(Handler handler);
  std::vector<CapturedRequest> requests() const;
  // Requests whose path is `path`.
  std::vector<CapturedRequest> requests_to(const std::string& path) const;
  // Waits until `n` requests to `path` have arrived; false after timeout_ms.
  bool wait_for_requests(const std::string& path, size_t n, int64_t timeout_ms) const;
  // Runs fn on a thread joined when the FakeServer is destroyed (a handler that streams).
  void spawn(std::function<void()> fn);
  // Closes the listening socket and every connection (a server that dies). Not from one of
  // its handlers, nor while a thread from spawn() may still write a response.
  void stop();
  int num_open_connections() const;  // 0 once stopped

 private:
  std::unique_ptr<net::http::Server> server_;  // guarded by mu_; null once stopped
  int port_ = 0;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Handler handler_;                        // guarded by mu_
  std::vector<CapturedRequest> requests_;  // guarded by mu_
  std::vector<std::thread> threads_;       // guarded by mu_
};

// A raw TCP server that answers every connection with script(fd, request) and then closes
// it: for what a well-behaved HTTP server cannot do, such as dying in the middle of a response.
// Connections are served one at a time.
class RawServer {
 public:
  using Script = std::function<void(const net::Fd& fd, const std::string& request)>;
  explicit RawServer(Script script);
  ~RawServer();
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int num_requests() const;

 private:
  void serve();
  Script script_;
  net::Fd listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> num_requests_{0};
  std::thread thread_;
};

// Handler pieces.

// Answers GET /health 200 and every POST with a whole completion JSON (what a prefill server
// answers for max_tokens = 1).
FakeServer::Handler prefill_handler();
// Answers GET /query with {"<rank>": {"engine_id": ids[rank], "worker_addr": {...}}}.
FakeServer::Handler bootstrap_handler(std::vector<std::string> engine_ids);
// Plays an encoder server (`--role encode`): answers /health 200 and every POST with a
// chat.completion whose ec_transfer_params.items hold one item per image part of the request:
// {"mm_hash": "mm-" + the image URL (at most its first 64 characters), "encoder": name}.
FakeServer::Handler encoder_handler(std::string name);
// The item encoder_handler() answers for an image URL.
std::string fake_mm_hash(const std::string& image_url);
// Answers /health 200, /v1/models with one model, and POST /v1/* with a stream of
// `num_chunks` SSE events and [DONE] when the body has "stream": true (spawned on `server`,
// `chunk_delay_ms` apart), else a whole completion JSON.
FakeServer::Handler decode_handler(FakeServer* server, int num_chunks = 3, int chunk_delay_ms = 0);

}  // namespace crescent::proxy::testing
