#include "net/http/http_server.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "net/http/parsed_request.h"

namespace crescent::net::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

std::string status_line_and_headers(int status, const std::string& content_type,
                                    const Headers& extra, bool keep_alive,
                                    const std::string* content_length) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
  out += reason_phrase(status);
  out += "\r\n";
  if (!content_type.empty()) {
    out += "Content-Type: " + content_type + "\r\n";
  }
  for (const auto& [name, value] : extra) {
    out += name + ": " + value + "\r\n";
  }
  if (content_length != nullptr) {
    out += "Content-Length: " + *content_length + "\r\n";
  } else {
    out += "Transfer-Encoding: chunked\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

std::string chunk(std::string_view data) {
  char size[32];
  int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out;
  out.reserve(static_cast<size_t>(n) + data.size() + 2);
  out.append(size, static_cast<size_t>(n));
  out.append(data);
  out.append("\r\n");
  return out;
}

class Connection;

struct ServerState {
  ServerOptions options;
  Handler handler;
  std::mutex mu;
  std::set<std::weak_ptr<Connection>, std::owner_less<std::weak_ptr<Connection>>> connections;
  std::atomic<int> num_open{0};
  // Responses whose end the handler has given (send() or end()) but whose bytes are not all
  // written yet: stop() lets these reach their clients before it closes connections.
  std::atomic<int> num_ending{0};
};

// Counts one response in ServerState::num_ending for as long as it lives.
class EndingMark {
 public:
  explicit EndingMark(std::shared_ptr<ServerState> state) : state_(std::move(state)) {
    state_->num_ending.fetch_add(1);
  }
  ~EndingMark() { state_->num_ending.fetch_sub(1); }
  EndingMark(const EndingMark&) = delete;
  EndingMark& operator=(const EndingMark&) = delete;

 private:
  std::shared_ptr<ServerState> state_;
};

// One response in progress on a connection. Holds the connection weakly: a writer kept by an
// engine callback after the client has gone must not keep the socket alive.
class Writer : public ResponseWriter {
 public:
  Writer(std::weak_ptr<Connection> connection, asio::any_io_executor strand,
         std::shared_ptr<ServerState> state)
      : connection_(std::move(connection)),
        strand_(std::move(strand)),
        server_state_(std::move(state)) {}

  void send(int status, std::string content_type, std::string body, Headers extra) override;
  void start_stream(int status, std::string content_type, Headers extra) override;
  void write(std::string data) override;
  void end() override;
  bool is_closed() const override { return closed_.load(std::memory_order_acquire); }
  void on_close(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_.load(std::memory_order_acquire)) {
        close_callbacks_.push_back(std::move(fn));
        return;
      }
    }
    fn();
  }

  // Called on the strand by the connection.
  void mark_closed(bool run_callbacks) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_.exchange(true)) {
        return;
      }
      callbacks.swap(close_callbacks_);
    }
    if (run_callbacks) {
      for (auto& fn : callbacks) {
        fn();
      }
    }
  }

 private:
  enum class State { kFresh, kStreaming, kDone };
  // Runs fn(connection) on the connection's strand if it still exists.
  template <typename Fn>
  void post(Fn fn);

  std::weak_ptr<Connection> connection_;
  asio::any_io_executor strand_;  // the connection's strand
  std::shared_ptr<ServerState> server_state_;
  std::atomic<State> state_{State::kFresh};
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::vector<std::function<void()>> close_callbacks_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, std::shared_ptr<ServerState> state)
      : stream_(std::move(socket)), state_(std::move(state)) {
    beast::error_code ec;
    auto endpoint = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      remote_ = endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
    }
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // All below run on the strand.
  void enqueue(std::string data) {
    if (closed_) {
      return;
    }
    queued_bytes_ += data.size();
    if (queued_bytes_ > state_->options.max_queued_output_bytes) {
      CRESCENT_LOG(kWarn) << "http: client " << remote_ << " is not reading; closing";
      close(/*client_gone=*/true);
      return;
    }
    out_queue_.push_back(std::move(data));
    if (!writing_) {
      write_some();
    }
  }
  // ending (may be null) counts the response as ending until it is written or dropped.
  void complete_response(bool keep_alive, std::shared_ptr<EndingMark> ending = nullptr) {
    ending_ = std::move(ending);
    response_complete_ = true;
    keep_alive_ = keep_alive_ && keep_alive;
    if (!writing_) {
      finish_response();
    }
  }
  bool request_keep_alive() const { return keep_alive_; }

  void close(bool client_gone) {
    if (closed_) {
      return;
    }
    closed_ = true;
    ending_.reset();
    if (writer_) {
      // A response that was fully written needs no abort.
      writer_->mark_closed(client_gone && in_response_);
    }
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    state_->num_open.fetch_sub(1);
  }

  // The socket's executor is the connection's strand (accepted with make_strand).
  asio::any_io_executor strand() { return stream_.get_executor(); }

 private:
  void read_request() {
    if (closed_) {
      return;
    }
    parser_.emplace();
    apply_limits(*parser_, state_->options);
    stream_.expires_after(std::chrono::milliseconds(state_->options.read_timeout_ms));
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) {
      return on_read_error(ec);
    }
    auto& msg = parser_->get();
    if (beast::iequals(msg[bhttp::field::expect], "100-continue")) {
      // curl waits a second for this before sending a large body.
      enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset) {
      return close(false);
    }
    if (ec == bhttp::error::body_limit) {
      return reply_error_and_close(413, "request body exceeds the limit of " +
                                            std::to_string(state_->options.max_body_bytes) +
                                            " bytes");
    }
    if (ec == bhttp::error::header_limit) {
      return reply_error_and_close(431, "request headers too large");
    }
    reply_error_and_close(400, "malformed HTTP request: " + ec.message());
  }

  void reply_error_and_close(int status, const std::string& message) {
    std::string body = R"({"error":{"message":")" + message +
                       R"(","type":"invalid_request_error","param":null,"code":)" +
                       std::to_string(status) + "}}";
    std::string length = std::to_string(body.size());
    keep_alive_ = false;
    stream_.expires_after(std::chrono::milliseconds(state_->options.read_timeout_ms));
    enqueue(status_line_and_headers(status, "application/json", {}, false, &length) + body);
    in_response_ = true;
    complete_response(false);
  }

  void on_body(beast::error_code ec) {
    if (ec) {
      return on_read_error(ec);
    }
    auto msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();
    Request request = to_request(std::move(msg), remote_);

    stream_.expires_never();
    in_response_ = true;
    response_complete_ = false;
    queued_bytes_ = 0;
    writer_ = std::make_shared<Writer>(weak_from_this(), strand(), state_);
    watch();
    try {
      state_->handler(std::move(request), writer_);
    } catch (const std::exception& e) {
      CRESCENT_LOG(kError) << "http: handler threw: " << e.what();
      writer_->send(
          500, "application/json",
          R"({"error":{"message":"internal error","type":"internal_error","param":null,"code":500}})",
          {});
    }
  }

  // Reads while a response is in progress, to notice a client that goes away. Bytes that
  // arrive (a pipelined next request) stay in buffer_ for the next read_request().
  void watch() {
    if (watching_ || closed_ || buffer_.size() > (1u << 20)) {
      return;
    }
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->watching_ = false;
                              if (self->lingering_) {
                                return ec ? self->close(false) : self->discard();
                              }
                              if (ec) {
                                return self->close(/*client_gone=*/true);
                              }
                              self->buffer_.commit(n);
                              // Bytes of the next request. While the response is still being
                              // written, stop watching: finish_response() goes on to
                              // read_request() (watching again would wait for bytes the client
                              // has already sent). A client that leaves now fails a write.
                              if (!self->in_response_) {
                                self->read_request();
                              }
                            });
  }

  void write_some() {
    writing_ = true;
    if (out_queue_.size() == 1) {
      current_write_ = std::move(out_queue_.front());
    } else {
      current_write_.clear();
      for (auto& piece : out_queue_) {
        current_write_ += piece;
      }
    }
    out_queue_.clear();
    asio::async_write(
        stream_.socket(), asio::buffer(current_write_),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_written(ec, n); });
  }

  void on_written(beast::error_code ec, size_t n) {
    writing_ = false;
    queued_bytes_ -= std::min<uint64_t>(queued_bytes_, n);
    if (ec) {
      return close(/*client_gone=*/true);
    }
    if (!out_queue_.empty()) {
      return write_some();
    }
    if (response_complete_) {
      finish_response();
    }
  }

  void finish_response() {
    if (!in_response_ || closed_) {
      return;
    }
    in_response_ = false;
    response_complete_ = false;
    ending_.reset();
    if (writer_) {
      writer_->mark_closed(false);
      writer_.reset();
    }
    if (!keep_alive_) {
      return linger_close();
    }
    if (!watching_) {
      read_request();
    } else {
      // The watch read goes on to read_request() when bytes come; bound the idle wait.
      stream_.expires_after(std::chrono::milliseconds(state_->options.read_timeout_ms));
    }
  }

  // Closing right after a response can reset the connection before the client has read it
  // (a client still sending a body it was refused gets "broken pipe" and never sees the
  // 413). So: stop sending, read and discard for a bounded time, then close.
  void linger_close() {
    lingering_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));
    if (!watching_) {
      discard();
    }
  }
  void discard() {
    buffer_.consume(buffer_.size());
    num_discarded_bytes_ += 1;
    if (closed_ || num_discarded_bytes_ > (256u << 20)) {
      return close(false);
    }
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(64 << 10),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->watching_ = false;
                              if (ec) {
                                return self->close(false);
                              }
                              self->num_discarded_bytes_ += n;
                              self->buffer_.commit(n);
                              self->discard();
                            });
  }

  beast::tcp_stream stream_;
  std::shared_ptr<ServerState> state_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<BeastRequestParser> parser_;
  std::shared_ptr<Writer> writer_;
  std::shared_ptr<EndingMark> ending_;
  std::deque<std::string> out_queue_;
  std::string current_write_;
  uint64_t queued_bytes_ = 0;
  bool writing_ = false;
  bool watching_ = false;
  bool in_response_ = false;
  bool response_complete_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool lingering_ = false;
  uint64_t num_discarded_bytes_ = 0;
};

template <typename Fn>
void Writer::post(Fn fn) {
  asio::dispatch(strand_, [weak = connection_, fn = std::move(fn)]() mutable {
    if (auto connection = weak.lock()) {
      fn(*connection);
    }
  });
}

void Writer::send(int status, std::string content_type, std::string body, Headers extra) {
  State expected = State::kFresh;
  if (!state_.compare_exchange_strong(expected, State::kDone)) {
    return;
  }
  // Counted from here, on the caller's thread: a stop() that follows must see it.
  auto ending = std::make_shared<EndingMark>(server_state_);
  post([status, content_type = std::move(content_type), body = std::move(body),
        extra = std::move(extra), ending](Connection& c) mutable {
    std::string length = std::to_string(body.size());
    c.enqueue(
        status_line_and_headers(status, content_type, extra, c.request_keep_alive(), &length) +
        body);
    c.complete_response(true, std::move(ending));
  });
}

void Writer::start_stream(int status, std::string content_type, Headers extra) {
  State expected = State::kFresh;
  if (!state_.compare_exchange_strong(expected, State::kStreaming)) {
    return;
  }
  post([status, content_type = std::move(content_type), extra = std::move(extra)](Connection& c) {
    c.enqueue(
        status_line_and_headers(status, content_type, extra, c.request_keep_alive(), nullptr));
  });
}

void Writer::write(std::string data) {
  if (data.empty() || state_.load() != State::kStreaming || is_closed()) {
    return;
  }
  post([data = chunk(data)](Connection& c) mutable { c.enqueue(std::move(data)); });
}

void Writer::end() {
  State expected = State::kStreaming;
  if (!state_.compare_exchange_strong(expected, State::kDone)) {
    return;
  }
  auto ending = std::make_shared<EndingMark>(server_state_);
  post([ending](Connection& c) mutable {
    c.enqueue("0\r\n\r\n");
    c.complete_response(true, std::move(ending));
  });
}

}  // namespace

struct Server::Impl {
  asio::io_context ioc;
  // Every acceptor operation (accept completions, close) runs on this strand: with several I/O
  // threads an unserialized close would race the accept handler's is_open()/async_accept().
  tcp::acceptor acceptor{asio::make_strand(ioc)};
  std::atomic<bool> accepting_closed{false};
  std::shared_ptr<ServerState> state = std::make_shared<ServerState>();
  std::vector<std::thread> threads;
  int port = 0;
  std::atomic<bool> stopped{false};

  void accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
          return;
        }
        CRESCENT_LOG(kWarn) << "http: accept failed: " << ec.message();
      } else {
        auto connection = std::make_shared<Connection>(std::move(s), state);
        state->num_open.fetch_add(1);
        {
          std::lock_guard<std::mutex> lock(state->mu);
          // Drop entries of connections that are gone.
          for (auto it = state->connections.begin(); it != state->connections.end();) {
            it = it->expired() ? state->connections.erase(it) : std::next(it);
          }
          state->connections.insert(connection);
        }
        connection->start();
      }
      accept();
    });
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() {
  stop();
}

Result<std::unique_ptr<Server>> Server::start(ServerOptions options, Handler handler) {
  auto impl = std::make_unique<Impl>();
  impl->state->options = options;
  impl->state->handler = std::move(handler);
  beast::error_code ec;
  auto address = asio::ip::make_address(options.host, ec);
  if (ec) {
    return invalid_argument("bad listen address '" + options.host + "': " + ec.message());
  }
  tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) {
    impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  }
  if (!ec) {
    impl->acceptor.bind(endpoint, ec);
  }
  if (!ec) {
    impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return unavailable("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                       ": " + ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->accept();
  int num_threads = std::max(1, options.num_io_threads);
  for (int i = 0; i < num_threads; ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const {
  return impl_->port;
}

void Server::stop_accepting() {
  if (impl_->accepting_closed.exchange(true)) {
    return;
  }
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

void Server::stop() {
  if (impl_->stopped.exchange(true)) {
    return;
  }
  stop_accepting();
  // Responses already given their end get a bounded time to reach their clients.
  auto flush_deadline = Deadline::after_ms(impl_->state->options.stop_flush_ms);
  while (impl_->state->num_ending.load() > 0 && !flush_deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> lock(impl_->state->mu);
    for (auto& weak : impl_->state->connections) {
      if (auto c = weak.lock()) {
        open.push_back(std::move(c));
      }
    }
    impl_->state->connections.clear();
  }
  for (auto& c : open) {
    asio::dispatch(c->strand(), [c] { c->close(false); });
  }
  open.clear();
  // Let the closes run, then stop whatever is left.
  asio::post(impl_->ioc, [impl = impl_.get()] { impl->ioc.stop(); });
  for (auto& t : impl_->threads) {
    t.join();
  }
  impl_->threads.clear();
  // Handlers that lost the race with ioc.stop() (connection closes, the acceptor close) run
  // here, so every socket is closed when stop() returns and no peer waits for its deadline.
  impl_->ioc.restart();
  impl_->ioc.poll();
}

int Server::num_open_connections() const {
  return impl_->state->num_open.load();
}

}  // namespace crescent::net::http
