// Fuzz target: the HTTP/1.1 request parsing of src/net/http/http_server.cc. The server reads
// requests with Boost.Beast's request_parser<string_body> (header and body limits from
// ServerOptions, apply_limits) from a flat buffer filled by socket reads of any size, parses
// pipelined requests one after another from what is left in that buffer, and turns each parsed
// message into a net::http::Request (to_request: lower-cased header names, path without the
// query). Both functions are the server's (net/http/parsed_request.h). This target does the
// same over arbitrary bytes delivered in several slices:
//   byte 0: limits: bit 0 -> small header limit, bit 1 -> small body limit (else the server's
//           defaults), so the 413/431 paths run with small inputs
//   byte 1: seed of the slice sizes (1..64 bytes, or all at once when 0)
//   rest:   the bytes "on the wire"
// Invariants: the parser returns a message, needs more, or an error (the server's 400, 413 or
// 431); it never crashes, reads out of bounds or loops; a parsed request satisfies what the
// handlers rely on (path is a prefix of target, header names are lower case, a body within
// the limit).

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/check.h"
#include "net/http/http_message.h"
#include "net/http/http_server.h"
#include "net/http/parsed_request.h"

namespace beast = boost::beast;
namespace bhttp = beast::http;
using crescent::net::http::Request;

namespace {

bool is_lower_case(const std::string& s) {
  for (char c : s) {
    if (c >= 'A' && c <= 'Z') {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) {
    return 0;
  }
  crescent::net::http::ServerOptions options;
  if ((data[0] & 2) != 0) {
    options.max_body_bytes = 64;
  }
  if ((data[0] & 1) != 0) {
    options.max_header_bytes = 128;
  }
  uint32_t seed = data[1];
  std::string_view wire(reinterpret_cast<const char*>(data + 2), size - 2);

  beast::flat_buffer buffer;
  size_t delivered = 0;
  // One socket read: 1..64 bytes chosen by the seed, or everything when the seed is 0.
  auto read_some = [&]() -> bool {
    if (delivered == wire.size()) {
      return false;
    }
    size_t n = wire.size() - delivered;
    if (seed != 0) {
      seed = seed * 1103515245u + 12345u;
      n = std::min<size_t>(n, 1 + (seed >> 16) % 64);
    }
    auto space = buffer.prepare(n);
    std::memcpy(space.data(), wire.data() + delivered, n);
    buffer.commit(n);
    delivered += n;
    return true;
  };

  int num_requests = 0;
  while (true) {
    std::optional<crescent::net::http::BeastRequestParser> parser;
    parser.emplace();
    crescent::net::http::apply_limits(*parser, options);
    beast::error_code ec;
    bool saw_expect_continue = false;
    while (!parser->is_done()) {
      if (buffer.size() == 0 && !read_some()) {
        break;
      }
      size_t used = parser->put(buffer.data(), ec);
      buffer.consume(used);
      if (ec == bhttp::error::need_more) {
        ec = {};
        if (!read_some()) {
          break;
        }
        continue;
      }
      if (ec) {
        break;
      }
      if (parser->is_header_done() && !saw_expect_continue) {
        saw_expect_continue = true;
        (void)beast::iequals(parser->get()[bhttp::field::expect], "100-continue");
      }
    }
    if (!ec && !parser->is_done()) {
      // The peer closed mid-request (or between requests): the server closes too.
      if (parser->got_some()) {
        parser->put_eof(ec);
      }
      break;
    }
    if (ec) {
      // The server answers 413, 431 or 400 and closes; nothing is parsed after an error.
      break;
    }
    auto& msg = parser->get();
    bool keep_alive = msg.keep_alive();
    Request request = crescent::net::http::to_request(parser->release(), "127.0.0.1:1");
    ++num_requests;
    CRESCENT_CHECK(request.target.compare(0, request.path.size(), request.path) == 0);
    CRESCENT_CHECK(request.body.size() <= options.max_body_bytes);
    for (const auto& [name, value] : request.headers) {
      CRESCENT_CHECK(is_lower_case(name)) << name;
      CRESCENT_CHECK(request.header(name) == value);
    }
    (void)crescent::net::http::header_value(request.headers, "Content-Type");
    if (!keep_alive) {
      break;  // the server closes after the response
    }
  }
  CRESCENT_CHECK(num_requests <= static_cast<int>(size));
  return 0;
}
