#pragma once
// Plain HTTP/1.1 message values shared by the server and the client: a request as the server
// hands it to a handler, and a response as the client returns it. Header names are stored
// lower-cased so lookups are case-insensitive. Value types; no I/O.

#include <map>
#include <string>
#include <string_view>

namespace crescent::net::http {

using Headers = std::map<std::string, std::string>;  // lower-case name -> value

// Returns the header's value or "" when absent. `name` may be in any case.
std::string header_value(const Headers& headers, std::string_view name);

struct Request {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // "/v1/completions?x=1"
  std::string path;    // target without the query string
  Headers headers;
  std::string body;
  std::string remote_address;  // "127.0.0.1:54321"

  std::string header(std::string_view name) const { return header_value(headers, name); }
};

struct Response {
  int status = 0;
  Headers headers;
  std::string body;

  std::string header(std::string_view name) const { return header_value(headers, name); }
};

// "OK", "Not Found", ...; "Unknown" for codes HTTP does not name.
std::string_view reason_phrase(int status);

}  // namespace crescent::net::http
