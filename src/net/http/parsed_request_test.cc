#include "net/http/parsed_request.h"

#include <gtest/gtest.h>

#include <boost/beast/core/buffers_to_string.hpp>
#include <string>

namespace crescent::net::http {
namespace {

namespace bhttp = boost::beast::http;

// Feeds `wire` to a parser set up as the server sets it up; the error or the Request.
boost::beast::error_code parse(const std::string& wire, const ServerOptions& options,
                               Request* out) {
  BeastRequestParser parser;
  apply_limits(parser, options);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(wire), ec);
  if (!ec && parser.is_done()) {
    *out = to_request(parser.release(), "127.0.0.1:5");
  }
  return ec;
}

TEST(ParsedRequestTest, LowerCasesHeaderNamesAndSplitsThePath) {
  Request r;
  auto ec = parse(
      "POST /v1/completions?stream=1 HTTP/1.1\r\nHost: x\r\nX-Request-ID: Ab\r\n"
      "Content-Length: 2\r\n\r\n{}",
      ServerOptions{}, &r);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/v1/completions?stream=1");
  EXPECT_EQ(r.path, "/v1/completions");
  EXPECT_EQ(r.headers.at("x-request-id"), "Ab");
  EXPECT_EQ(r.header("X-Request-Id"), "Ab");
  EXPECT_EQ(r.body, "{}");
  EXPECT_EQ(r.remote_address, "127.0.0.1:5");
}

TEST(ParsedRequestTest, ChunkedBodyIsJoined) {
  Request r;
  auto ec = parse(
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
      ServerOptions{}, &r);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(r.path, "/a");
  EXPECT_EQ(r.body, "abcde");
}

TEST(ParsedRequestTest, LimitsComeFromTheOptions) {
  ServerOptions options;
  options.max_body_bytes = 4;
  Request r;
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde", options, &r),
            bhttp::error::body_limit);
  options.max_header_bytes = 16;
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a-long-host-name\r\n\r\n", options, &r),
            bhttp::error::header_limit);
}

}  // namespace
}  // namespace crescent::net::http
