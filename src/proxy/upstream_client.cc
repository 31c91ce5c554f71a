#include "proxy/upstream_client.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "core/logging.h"

namespace crescent::proxy {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

// A connection and the bytes read past the last response (none, for a reusable one).
struct Connection {
  explicit Connection(asio::io_context& ioc) : socket(ioc) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
  TimePoint idle_since;
};

// True when an idle connection can carry another request: the peer has not closed it and sent
// nothing unasked.
bool is_reusable(Connection& c) {
  if (!c.socket.is_open() || c.buffer.size() != 0) {
    return false;
  }
  char byte;
  ssize_t n = ::recv(c.socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void close_quietly(tcp::socket& socket) {
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

}  // namespace

class CallImpl;

struct UpstreamCore {
  explicit UpstreamCore(UpstreamClientOptions o) : options(o), work(asio::make_work_guard(ioc)) {}

  // Declared first so that it is destroyed last, after every socket it owns.
  asio::io_context ioc;
  UpstreamClientOptions options;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;

  std::mutex mu;
  bool stopping = false;                                                // guarded by mu
  std::map<std::string, std::deque<std::unique_ptr<Connection>>> idle;  // guarded by mu
  std::set<std::weak_ptr<CallImpl>, std::owner_less<std::weak_ptr<CallImpl>>> live;  // by mu
  std::atomic<int64_t> num_connects{0};
  std::atomic<int64_t> num_reuses{0};
  std::atomic<int> num_in_flight{0};

  // An idle connection to key that still works, or null.
  std::unique_ptr<Connection> take_idle(const std::string& key) {
    std::vector<std::unique_ptr<Connection>> stale;
    std::unique_ptr<Connection> found;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = idle.find(key);
      if (it == idle.end()) {
        return nullptr;
      }
      auto& list = it->second;
      auto too_old = Clock::now() - std::chrono::milliseconds(options.max_idle_ms);
      // Most recently used first: the likeliest to be alive.
      while (!list.empty() && !found) {
        auto c = std::move(list.back());
        list.pop_back();
        if (c->idle_since >= too_old && is_reusable(*c)) {
          found = std::move(c);
        } else {
          stale.push_back(std::move(c));
        }
      }
    }
    for (auto& c : stale) {
      close_quietly(c->socket);
    }
    return found;
  }

  void put_idle(const std::string& key, std::unique_ptr<Connection> c) {
    c->idle_since = Clock::now();
    std::unique_ptr<Connection> evicted;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!stopping) {
        auto& list = idle[key];
        list.push_back(std::move(c));
        if (list.size() > options.max_idle_connections_per_upstream) {
          evicted = std::move(list.front());
          list.pop_front();
        }
      } else {
        evicted = std::move(c);
      }
    }
    if (evicted) {
      close_quietly(evicted->socket);
    }
  }
};

// One request. Everything below runs on strand_ except cancel() and the constructor.
class CallImpl : public UpstreamCall, public std::enable_shared_from_this<CallImpl> {
 public:
  CallImpl(std::shared_ptr<UpstreamCore> core, std::string host, int port, UpstreamRequest request,
           UpstreamCallbacks callbacks, Deadline deadline)
      : core_(std::move(core)),
        strand_(asio::make_strand(core_->ioc)),
        timer_(strand_),
        resolver_(strand_),
        host_(std::move(host)),
        port_(port),
        callbacks_(std::move(callbacks)),
        deadline_(deadline) {
    name_ = (host_.find(':') == std::string::npos ? host_ : "[" + host_ + "]") + ":" +
            std::to_string(port_);
    request_.method_string(request.method);
    request_.target(request.target);
    request_.version(11);
    request_.set(bhttp::field::host, name_);
    for (const auto& [name, value] : request.headers) {
      request_.set(name, value);
    }
    request_.keep_alive(true);
    if (!request.body.empty() || request.method == "POST" || request.method == "PUT") {
      request_.body() = std::move(request.body);
      request_.prepare_payload();
    }
  }

  void begin() {
    asio::post(strand_, [self = shared_from_this()] { self->on_begin(); });
  }

  void cancel() override {
    asio::post(strand_,
               [self = shared_from_this()] { self->finish(cancelled("upstream call cancelled")); });
  }

 private:
  void on_begin() {
    if (done_) {
      return;
    }
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      stopping = core_->stopping;
    }
    if (stopping) {
      // Outside the lock: finish() takes it to drop this call from the live set.
      return finish(cancelled("the upstream client is shutting down"));
    }
    conn_ = core_->take_idle(name_);
    if (conn_) {
      reused_ = true;
      core_->num_reuses.fetch_add(1);
      arm_timer(deadline_.when());
      return send();
    }
    connect();
  }

  // One timer serves the connect timeout and the call's deadline; a generation number tells a
  // stale expiry (from before re-arming) from a live one.
  void arm_timer(TimePoint when) {
    uint64_t generation = ++timer_generation_;
    timer_.expires_at(when);
    timer_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
      if (ec || generation != self->timer_generation_ || self->done_) {
        return;
      }
      if (self->deadline_.is_expired()) {
        return self->finish(deadline_exceeded("no complete answer from " + self->name_ +
                                              " before the request's deadline"));
      }
      self->finish(unavailable("connecting to " + self->name_ + " timed out after " +
                               std::to_string(self->core_->options.connect_timeout_ms) + " ms"));
    });
  }

  void connect() {
    reused_ = false;
    conn_ = std::make_unique<Connection>(core_->ioc);
    arm_timer(std::min(deadline_.when(), Clock::now() + std::chrono::milliseconds(
                                                            core_->options.connect_timeout_ms)));
    core_->num_connects.fetch_add(1);
    beast::error_code ec;
    auto address = asio::ip::make_address(host_, ec);
    if (!ec) {
      conn_->socket.async_connect(
          tcp::endpoint(address, static_cast<uint16_t>(port_)),
          asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code e) {
            self->on_connected(e);
          }));
      return;
    }
    resolver_.async_resolve(
        host_, std::to_string(port_),
        [self = shared_from_this()](beast::error_code e, tcp::resolver::results_type results) {
          if (self->done_) {
            return;
          }
          if (e) {
            return self->finish(unavailable("cannot resolve " + self->host_ + ": " + e.message()));
          }
          asio::async_connect(self->conn_->socket, results,
                              asio::bind_executor(self->strand_, [self](beast::error_code e2,
                                                                        const tcp::endpoint&) {
                                self->on_connected(e2);
                              }));
        });
  }

  void on_connected(beast::error_code ec) {
    if (done_) {
      return;
    }
    if (ec) {
      return finish(unavailable("cannot connect to " + name_ + ": " + ec.message()));
    }
    beast::error_code ignored;
    conn_->socket.set_option(tcp::no_delay(true), ignored);
    arm_timer(deadline_.when());
    send();
  }

  void send() {
    bhttp::async_write(
        conn_->socket, request_,
        asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t) {
          self->on_sent(ec);
        }));
  }

  // A kept-alive connection that the server closed while it was idle fails on first use with
  // nothing of a response read: then, and only then, the request goes once more on a new one.
  bool retry_on_fresh_connection(beast::error_code ec) {
    bool closed_by_peer = ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
                          ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
    if (!reused_ || has_retried_ || !closed_by_peer) {
      return false;
    }
    has_retried_ = true;
    close_quietly(conn_->socket);
    connect();
    return true;
  }

  void on_sent(beast::error_code ec) {
    if (done_) {
      return;
    }
    if (ec) {
      if (retry_on_fresh_connection(ec)) {
        return;
      }
      return finish(unavailable("sending the request to " + name_ + " failed: " + ec.message()));
    }
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    bhttp::async_read_header(
        conn_->socket, conn_->buffer, *parser_,
        asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code e, size_t) {
          self->on_header(e);
        }));
  }

  void on_header(beast::error_code ec) {
    if (done_) {
      return;
    }
    if (ec) {
      if (retry_on_fresh_connection(ec)) {
        return;
      }
      return finish(
          unavailable(name_ + " closed the connection before answering: " + ec.message()));
    }
    auto& msg = parser_->get();
    net::http::Headers headers;
    for (const auto& field : msg) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      headers[name] = std::string(field.value());
    }
    if (callbacks_.on_headers) {
      callbacks_.on_headers(static_cast<int>(msg.result_int()), headers);
    }
    on_body_progress();
  }

  void read_body() {
    bhttp::async_read_some(
        conn_->socket, conn_->buffer, *parser_,
        asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code e, size_t) {
          self->on_body(e);
        }));
  }

  void on_body(beast::error_code ec) {
    if (done_) {
      return;
    }
    if (ec) {
      return finish(unavailable("the connection to " + name_ +
                                " broke in the middle of the response: " + ec.message()));
    }
    on_body_progress();
  }

  void on_body_progress() {
    std::string& body = parser_->get().body();
    if (!body.empty()) {
      std::string piece;
      piece.swap(body);
      if (callbacks_.on_data) {
        callbacks_.on_data(std::move(piece));
      }
      if (done_) {  // the callback cannot end the call, but stay defensive
        return;
      }
    }
    if (!parser_->is_done()) {
      return read_body();
    }
    bool keep_alive = parser_->keep_alive();
    parser_.reset();
    if (keep_alive && conn_->buffer.size() == 0) {
      core_->put_idle(name_, std::move(conn_));
    }
    finish(Status::ok());
  }

  void finish(Status status) {
    if (done_) {
      return;
    }
    done_ = true;
    timer_.cancel();
    resolver_.cancel();
    if (conn_) {
      // Closed, not destroyed: an operation still pending on it completes (aborted) later
      // and uses its buffer; the connection goes when the call does.
      close_quietly(conn_->socket);
    }
    // Callbacks usually hold the caller's request state, which holds this call: drop them so
    // neither outlives the other.
    UpstreamCallbacks callbacks = std::move(callbacks_);
    callbacks_ = {};
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->live.erase(weak_from_this());
    }
    core_->num_in_flight.fetch_sub(1);
    if (callbacks.on_done) {
      callbacks.on_done(std::move(status));
    }
  }

  std::shared_ptr<UpstreamCore> core_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer timer_;
  tcp::resolver resolver_;
  std::string host_;
  int port_;
  std::string name_;  // "host:port", the pool key and how messages name the upstream
  bhttp::request<bhttp::string_body> request_;
  UpstreamCallbacks callbacks_;
  Deadline deadline_;

  std::unique_ptr<Connection> conn_;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser_;
  uint64_t timer_generation_ = 0;
  bool reused_ = false;
  bool has_retried_ = false;
  bool done_ = false;
};

UpstreamClient::UpstreamClient(UpstreamClientOptions options)
    : core_(std::make_shared<UpstreamCore>(options)) {
  int n = std::max(1, options.num_io_threads);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([core = core_.get()] { core->ioc.run(); });
  }
}

UpstreamClient::~UpstreamClient() {
  shutdown();
}

void UpstreamClient::shutdown() {
  std::vector<std::shared_ptr<CallImpl>> live;
  std::map<std::string, std::deque<std::unique_ptr<Connection>>> idle;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->stopping) {
      return;
    }
    core_->stopping = true;
    for (auto& weak : core_->live) {
      if (auto call = weak.lock()) {
        live.push_back(std::move(call));
      }
    }
    idle.swap(core_->idle);
  }
  for (auto& call : live) {
    call->cancel();
  }
  live.clear();
  for (auto& [key, list] : idle) {
    for (auto& c : list) {
      close_quietly(c->socket);
    }
  }
  idle.clear();
  // Every operation left is being cancelled; the threads return once their handlers ran.
  core_->work.reset();
  for (auto& t : threads_) {
    t.join();
  }
  threads_.clear();
}

std::shared_ptr<UpstreamCall> UpstreamClient::start(const std::string& host, int port,
                                                    UpstreamRequest request,
                                                    UpstreamCallbacks callbacks,
                                                    Deadline deadline) {
  auto call = std::make_shared<CallImpl>(core_, host, port, std::move(request),
                                         std::move(callbacks), deadline);
  core_->num_in_flight.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->live.insert(call);
  }
  call->begin();
  return call;
}

UpstreamClient::Stats UpstreamClient::stats() const {
  Stats s;
  s.num_connects = core_->num_connects.load();
  s.num_reuses = core_->num_reuses.load();
  s.num_in_flight = core_->num_in_flight.load();
  std::lock_guard<std::mutex> lock(core_->mu);
  for (const auto& [key, list] : core_->idle) {
    s.num_idle += static_cast<int>(list.size());
  }
  return s;
}

}  // namespace crescent::proxy
