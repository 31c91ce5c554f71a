#include "net/http/http_message.h"

#include <algorithm>
#include <boost/beast/http/status.hpp>
#include <cctype>
#include <ostream>  // boost 1.74 status.hpp needs it first

namespace crescent::net::http {

std::string header_value(const Headers& headers, std::string_view name) {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto it = headers.find(key);
  return it == headers.end() ? std::string() : it->second;
}

std::string_view reason_phrase(int status) {
  auto text = boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(status));
  return std::string_view(text.data(), text.size());
}

}  // namespace crescent::net::http
