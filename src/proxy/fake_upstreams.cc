#include "proxy/fake_upstreams.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/clock.h"

namespace crescent::proxy::testing {

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

bool Gate::is_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

bool Gate::wait(int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return open_; });
}

std::string CapturedRequest::header(const std::string& name) const {
  return net::http::header_value(headers, name);
}

FakeServer::FakeServer(Handler handler, int num_io_threads, int port)
    : handler_(std::move(handler)) {
  net::http::ServerOptions options;
  options.num_io_threads = num_io_threads;
  options.port = port;
  auto server = net::http::Server::start(options, [this](net::http::Request request,
                                                         std::shared_ptr<net::http::ResponseWriter>
                                                             writer) {
    Handler handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back({request.method, request.path, request.headers, request.body, now_ns()});
      handler = handler_;
    }
    cv_.notify_all();
    handler(request, std::move(writer));
  });
  if (!server.is_ok()) {
    std::fprintf(stderr, "fake server: %s\n", server.status().to_string().c_str());
    std::abort();
  }
  server_ = std::move(server).value();
  port_ = server_->port();
}

FakeServer::~FakeServer() {
  std::unique_ptr<net::http::Server> server;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    server.swap(server_);
    threads.swap(threads_);
  }
  if (server) {
    server->stop();  // what spawned threads still write is dropped
  }
  for (auto& t : threads) {
    t.join();
  }
  // `server` goes last: a spawned thread's writer posts to its io_context until joined.
}

void FakeServer::set_handler(Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handler_ = std::move(handler);
}

std::vector<CapturedRequest> FakeServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

std::vector<CapturedRequest> FakeServer::requests_to(const std::string& path) const {
  std::vector<CapturedRequest> out;
  for (auto& r : requests()) {
    if (r.path == path) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

bool FakeServer::wait_for_requests(const std::string& path, size_t n, int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    size_t count = 0;
    for (const auto& r : requests_) {
      count += r.path == path ? 1 : 0;
    }
    return count >= n;
  });
}

void FakeServer::spawn(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back(std::move(fn));
}

void FakeServer::stop() {
  // Destroyed, not only stopped: Server::stop() can return with a connection or the listening
  // socket still open (its closes race the io_context's stop); destruction closes them all.
  std::unique_ptr<net::http::Server> server;
  {
    std::lock_guard<std::mutex> lock(mu_);
    server.swap(server_);
  }
  if (server) {
    server->stop();
  }
}

int FakeServer::num_open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_ ? server_->num_open_connections() : 0;
}

RawServer::RawServer(Script script) : script_(std::move(script)) {
  auto listener = net::listen_tcp("127.0.0.1", 0);
  auto port = listener.is_ok() ? net::local_port(*listener) : Result<int>(listener.status());
  if (!port.is_ok()) {
    std::fprintf(stderr, "raw server: %s\n", port.status().to_string().c_str());
    std::abort();
  }
  listener_ = std::move(listener).value();
  port_ = *port;
  thread_ = std::thread([this] { serve(); });
}

RawServer::~RawServer() {
  stop_ = true;
  thread_.join();
}

int RawServer::num_requests() const {
  return num_requests_.load();
}

void RawServer::serve() {
  while (!stop_) {
    auto fd = net::accept_with_deadline(listener_, Deadline::after_ms(50));
    if (!fd.is_ok()) {
      continue;
    }
    // The request head, then as many body bytes as Content-Length says.
    std::string request;
    auto deadline = Deadline::after_ms(5000);
    bool ok = true;
    while (ok && request.find("\r\n\r\n") == std::string::npos) {
      char c;
      ok = net::read_exact(*fd, &c, 1, deadline).is_ok();
      request += c;
    }
    if (!ok) {
      continue;
    }
    size_t length = 0;
    if (auto pos = request.find("Content-Length: "); pos != std::string::npos) {
      length = std::strtoull(request.c_str() + pos + 16, nullptr, 10);
    } else if (auto lower = request.find("content-length: "); lower != std::string::npos) {
      length = std::strtoull(request.c_str() + lower + 16, nullptr, 10);
    }
    std::string body(length, '\0');
    if (length > 0 && !net::read_exact(*fd, body.data(), length, deadline).is_ok()) {
      continue;
    }
    num_requests_.fetch_add(1);
    script_(*fd, request + body);
  }
}

FakeServer::Handler prefill_handler() {
  return [](const net::http::Request& request, std::shared_ptr<net::http::ResponseWriter> writer) {
    if (request.path == "/health") {
      return writer->send(200, "application/json", "{}");
    }
    nlohmann::json body = {
        {"id", "cmpl-prefill"},
        {"object", "text_completion"},
        {"choices", {{{"index", 0}, {"text", "x"}, {"finish_reason", "length"}}}},
        {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 1}}}};
    writer->send(200, "application/json", body.dump());
  };
}

FakeServer::Handler bootstrap_handler(std::vector<std::string> engine_ids) {
  return [engine_ids](const net::http::Request& request,
                      std::shared_ptr<net::http::ResponseWriter> writer) {
    if (request.path != "/query") {
      return writer->send(200, "application/json", "{}");
    }
    nlohmann::json body = nlohmann::json::object();
    for (size_t rank = 0; rank < engine_ids.size(); ++rank) {
      body[std::to_string(rank)] = {{"engine_id", engine_ids[rank]},
                                    {"worker_addr", {{"0", {{"0", "tcp://127.0.0.1:1"}}}}}};
    }
    writer->send(200, "application/json", body.dump());
  };
}

std::string fake_mm_hash(const std::string& image_url) {
  return "mm-" + image_url.substr(0, 64);
}

FakeServer::Handler encoder_handler(std::string name) {
  return
      [name](const net::http::Request& request, std::shared_ptr<net::http::ResponseWriter> writer) {
        if (request.path == "/health") {
          return writer->send(200, "application/json", "{}");
        }
        auto body = nlohmann::json::parse(request.body, nullptr, false);
        nlohmann::json items = nlohmann::json::array();
        if (body.is_object() && body.contains("messages")) {
          for (const auto& message : body["messages"]) {
            if (!message.contains("content") || !message["content"].is_array()) {
              continue;
            }
            for (const auto& part : message["content"]) {
              if (!part.contains("image_url")) {
                continue;
              }
              const auto& image = part["image_url"];
              std::string url =
                  image.is_string() ? image.get<std::string>() : image.value("url", std::string());
              items.push_back({{"mm_hash", fake_mm_hash(url)}, {"encoder", name}});
            }
          }
        }
        nlohmann::json answer = {{"id", "chatcmpl-encode"},
                                 {"object", "chat.completion"},
                                 {"choices",
                                  {{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", ""}}},
                                    {"finish_reason", "length"}}}},
                                 {"ec_transfer_params", {{"items", items}}}};
        writer->send(200, "application/json", answer.dump());
      };
}

FakeServer::Handler decode_handler(FakeServer* server, int num_chunks, int chunk_delay_ms) {
  return [server, num_chunks, chunk_delay_ms](const net::http::Request& request,
                                              std::shared_ptr<net::http::ResponseWriter> writer) {
    if (request.path == "/health") {
      return writer->send(200, "application/json", "{}");
    }
    if (request.path == "/v1/models") {
      return writer->send(200, "application/json",
                          R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
    }
    if (request.path == "/tokenize") {
      return writer->send(200, "application/json", R"({"count":3,"tokens":[7,8,9]})");
    }
    if (request.path == "/detokenize") {
      return writer->send(200, "application/json", R"({"prompt":"seven eight"})");
    }
    auto body = nlohmann::json::parse(request.body, nullptr, false);
    bool stream = body.is_object() && body.value("stream", false);
    if (!stream) {
      nlohmann::json answer = {
          {"id", "cmpl-decode"},
          {"object", "text_completion"},
          {"choices", {{{"index", 0}, {"text", "hello world"}, {"finish_reason", "length"}}}}};
      return writer->send(200, "application/json", answer.dump());
    }
    writer->start_stream(200, "text/event-stream");
    auto emit = [writer, num_chunks, chunk_delay_ms] {
      for (int i = 0; i < num_chunks; ++i) {
        if (chunk_delay_ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(chunk_delay_ms));
        }
        nlohmann::json chunk = {{"id", "cmpl-decode"},
                                {"object", "text_completion"},
                                {"choices", {{{"index", 0}, {"text", "t" + std::to_string(i)}}}}};
        writer->write("data: " + chunk.dump() + "\n\n");
      }
      writer->write("data: [DONE]\n\n");
      writer->end();
    };
    if (chunk_delay_ms > 0) {
      server->spawn(emit);
    } else {
      emit();
    }
  };
}

}  // namespace crescent::proxy::testing
