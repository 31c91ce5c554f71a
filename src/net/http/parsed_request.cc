#include "net/http/parsed_request.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace crescent::net::http {

namespace bhttp = boost::beast::http;

void apply_limits(BeastRequestParser& parser, const ServerOptions& options) {
  parser.body_limit(options.max_body_bytes);
  parser.header_limit(options.max_header_bytes);
}

Request to_request(bhttp::request<bhttp::string_body>&& msg, std::string remote_address) {
  Request request;
  request.method = std::string(msg.method_string());
  request.target = std::string(msg.target());
  auto q = request.target.find('?');
  request.path = q == std::string::npos ? request.target : request.target.substr(0, q);
  for (const auto& field : msg) {
    std::string name(field.name_string().data(), field.name_string().size());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    request.headers[std::move(name)] = std::string(field.value());
  }
  request.body = std::move(msg.body());
  request.remote_address = std::move(remote_address);
  return request;
}

}  // namespace crescent::net::http
