#pragma once
// An asynchronous HTTP/1.1 server on Boost.Asio/Beast: keep-alive, a request body size limit,
// read timeouts, and responses that are either whole or streamed with chunked transfer
// encoding (Server-Sent Events ride on the latter).
//
// The handler is called on one of the server's I/O threads and must not block: it answers
// through the ResponseWriter, whose methods are thread-safe and never block either, so an
// engine thread can stream tokens into it directly. While a response is in progress the
// server keeps reading the socket, so a client that goes away is noticed at once and the
// writer's on_close callback runs (on an I/O thread).
//
// Server owns its I/O threads and connections; destroying it (or stop()) closes everything.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "net/http/http_message.h"

namespace crescent::net::http {

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;

  // A whole response with Content-Length. Only the first send()/start_stream() counts;
  // later calls are ignored.
  virtual void send(int status, std::string content_type, std::string body,
                    Headers extra_headers = {}) = 0;
  // Starts a chunked response; follow with write() calls and one end().
  virtual void start_stream(int status, std::string content_type, Headers extra_headers = {}) = 0;
  // Queues one chunk of a started stream. Empty data is ignored (it would end the stream).
  virtual void write(std::string data) = 0;
  // Ends a started stream (the terminating chunk).
  virtual void end() = 0;

  // True once the client has gone away (or the server closed the connection). Writes after
  // that are dropped.
  virtual bool is_closed() const = 0;
  // Runs fn once if the connection closes before the response has been fully written;
  // at once (on the caller's thread) if it already has.
  virtual void on_close(std::function<void()> fn) = 0;
};

using Handler = std::function<void(Request request, std::shared_ptr<ResponseWriter> writer)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (see Server::port())
  int num_io_threads = 1;
  uint64_t max_body_bytes = 32ull << 20;  // larger bodies get 413
  uint32_t max_header_bytes = 64u << 10;  // larger headers get 431
  // How long a connection may take to send one request, and how long an idle keep-alive
  // connection is kept.
  int64_t read_timeout_ms = 60'000;
  // A client that stops reading a streamed response is cut off once this much is queued.
  uint64_t max_queued_output_bytes = 64ull << 20;
  // stop() waits up to this long for responses whose end was already given (a final send() or
  // end()) to be written, so a drained request's last bytes are not cut off.
  int64_t stop_flush_ms = 2'000;
};

class Server {
 public:
  // Binds, listens and starts the I/O threads. Unavailable if the address is in use.
  static Result<std::unique_ptr<Server>> start(ServerOptions options, Handler handler);
  ~Server();

  int port() const;
  // Closes the listening socket; connections already open keep working.
  void stop_accepting();
  // Lets responses that were already ended finish writing (up to stop_flush_ms), then closes
  // every connection and joins the I/O threads. Idempotent.
  void stop();
  int num_open_connections() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::net::http
