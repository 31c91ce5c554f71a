#include "net/http/http_client.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <limits>
#include <optional>

namespace crescent::net::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

}  // namespace

struct HttpClient::Impl {
  std::string host;
  int port;
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs the io_context until the operation started before completes; the stream's timer
  // makes sure it does.
  void run() {
    ioc.restart();
    ioc.run();
  }

  Status connect(Deadline deadline) {
    if (stream && stream->socket().is_open()) {
      return Status::ok();
    }
    stream.emplace(ioc);
    buffer.clear();
    beast::error_code ec;
    auto address = asio::ip::make_address(host, ec);
    if (ec) {
      tcp::resolver resolver(ioc);
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec || results.empty()) {
        return unavailable("cannot resolve " + host + ": " + ec.message());
      }
      address = results.begin()->endpoint().address();
    }
    stream->expires_at(deadline.when());
    beast::error_code result;
    stream->async_connect(tcp::endpoint(address, static_cast<uint16_t>(port)),
                          [&](beast::error_code e) { result = e; });
    run();
    if (result) {
      stream.reset();
      if (result == beast::error::timeout) {
        return deadline_exceeded("connect to " + host + ":" + std::to_string(port) + " timed out");
      }
      return unavailable("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                         result.message());
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    return Status::ok();
  }

  Status fail(const beast::error_code& ec, std::string_view what) {
    stream.reset();
    if (ec == beast::error::timeout) {
      return deadline_exceeded(std::string(what) + " timed out");
    }
    return unavailable(std::string(what) + ": " + ec.message());
  }

  Result<Response> exchange(std::string_view method, std::string_view target, std::string body,
                            const Headers& headers,
                            const std::function<bool(std::string_view)>* on_data,
                            Deadline deadline) {
    // A kept-alive connection the server has since closed fails on first use: retry once on a
    // fresh connection when nothing of the response was read.
    for (int attempt = 0;; ++attempt) {
      bool reused = stream && stream->socket().is_open();
      RETURN_IF_ERROR(connect(deadline));
      bhttp::request<bhttp::string_body> req;
      req.method_string(beast::string_view(method.data(), method.size()));
      req.target(beast::string_view(target.data(), target.size()));
      req.version(11);
      req.set(bhttp::field::host, host + ":" + std::to_string(port));
      for (const auto& [name, value] : headers) {
        req.set(name, value);
      }
      if (!body.empty() || method == "POST" || method == "PUT") {
        req.body() = body;
        req.prepare_payload();
      }
      stream->expires_at(deadline.when());
      beast::error_code ec;
      bhttp::async_write(*stream, req, [&](beast::error_code e, size_t) { ec = e; });
      run();
      if (ec) {
        if (reused && attempt == 0) {
          stream.reset();
          continue;
        }
        return fail(ec, "sending the request");
      }
      bhttp::response_parser<bhttp::string_body> parser;
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      bool got_any = false;
      while (!parser.is_done()) {
        stream->expires_at(deadline.when());
        size_t n = 0;
        bhttp::async_read_some(*stream, buffer, parser, [&](beast::error_code e, size_t m) {
          ec = e;
          n = m;
        });
        run();
        if (ec) {
          if (reused && attempt == 0 && !got_any &&
              (ec == bhttp::error::end_of_stream || ec == asio::error::connection_reset)) {
            break;
          }
          return fail(ec, "reading the response");
        }
        got_any = true;
        if (on_data != nullptr && parser.is_header_done() && !parser.get().body().empty()) {
          std::string piece;
          piece.swap(parser.get().body());
          if (!(*on_data)(piece)) {
            Response partial;
            partial.status = static_cast<int>(parser.get().result_int());
            stream.reset();
            return partial;
          }
        }
      }
      if (ec) {
        stream.reset();
        continue;  // the retry above
      }
      auto msg = parser.release();
      Response response;
      response.status = static_cast<int>(msg.result_int());
      for (const auto& field : msg) {
        std::string name(field.name_string());
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        response.headers[name] = std::string(field.value());
      }
      if (on_data == nullptr) {
        response.body = std::move(msg.body());
      }
      if (!msg.keep_alive()) {
        stream.reset();
      }
      return response;
    }
  }
};

HttpClient::HttpClient(std::string host, int port) : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
}
HttpClient::~HttpClient() = default;

Result<Response> HttpClient::request(std::string_view method, std::string_view target,
                                     std::string body, Headers headers, Deadline deadline) {
  try {
    return impl_->exchange(method, target, std::move(body), headers, nullptr, deadline);
  } catch (const std::exception& e) {
    impl_->stream.reset();
    return internal_error(std::string("http client: ") + e.what());
  }
}

Result<Response> HttpClient::stream(std::string_view method, std::string_view target,
                                    std::string body, Headers headers,
                                    const std::function<bool(std::string_view)>& on_data,
                                    Deadline deadline) {
  try {
    return impl_->exchange(method, target, std::move(body), headers, &on_data, deadline);
  } catch (const std::exception& e) {
    impl_->stream.reset();
    return internal_error(std::string("http client: ") + e.what());
  }
}

void HttpClient::close() {
  impl_->stream.reset();
}

void SseParser::feed(std::string_view bytes,
                     const std::function<void(std::string_view)>& on_event) {
  pending_.append(bytes);
  size_t start = 0;
  while (true) {
    // Events end with a blank line; accept \n\n and \r\n\r\n.
    size_t end = pending_.find("\n\n", start);
    size_t crlf = pending_.find("\r\n\r\n", start);
    size_t sep_len = 2;
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep_len = 4;
    }
    if (end == std::string::npos) {
      break;
    }
    std::string_view event(pending_.data() + start, end - start);
    std::string data;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string_view line =
          event.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
      if (!line.empty() && line.back() == '\r') {
        line.remove_suffix(1);
      }
      if (line.substr(0, 5) == "data:") {
        std::string_view value = line.substr(5);
        if (!value.empty() && value.front() == ' ') {
          value.remove_prefix(1);
        }
        if (has_data) {
          data += '\n';
        }
        data.append(value);
        has_data = true;
      }
      if (nl == std::string_view::npos) {
        break;
      }
      pos = nl + 1;
    }
    if (has_data) {
      on_event(data);
    }
    start = end + sep_len;
  }
  pending_.erase(0, start);
}

}  // namespace crescent::net::http
