#pragma once
// How the server reads one request off a connection with Boost.Beast: the parser as the server
// sets it up (ServerOptions' body and header limits) and the Request a handler gets from a
// parsed message (header names lower-cased, path without the query). Included by the server
// and by fuzz/http_request_fuzz.cc, so the fuzz target parses exactly as the server does.

#include <boost/beast/http.hpp>
#include <string>

#include "net/http/http_message.h"
#include "net/http/http_server.h"

namespace crescent::net::http {

using BeastRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Sets the limits of a fresh parser: a body over max_body_bytes fails with body_limit (413),
// headers over max_header_bytes with header_limit (431).
void apply_limits(BeastRequestParser& parser, const ServerOptions& options);

// The Request of a parsed message; remote_address as given.
Request to_request(boost::beast::http::request<boost::beast::http::string_body>&& msg,
                   std::string remote_address);

}  // namespace crescent::net::http
