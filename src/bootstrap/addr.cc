// Strict parsing of the two address shapes the bootstrap protocol carries: worker transfer
// addresses ("tcp://host:port") and bootstrap urls ("http://host:port[/]").

#include <cctype>
#include <string>
#include <string_view>
#include <utility>

#include "bootstrap/bootstrap_client.h"

namespace crescent::bootstrap {
namespace {

// A DNS name or IPv4 literal: letters, digits, '.', '-', '_'. IPv6 literals come bracketed.
bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_';
}

bool is_ipv6_char(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == ':' || c == '.';
}

// "host:port" (host may be "[v6]") -> {host without brackets, port}. Errors read
// "bad <kind> '<whole input>': <why>".
Result<std::pair<std::string, int>> parse_host_port(std::string_view rest, std::string_view kind,
                                                    std::string_view whole) {
  auto bad = [&](std::string_view why) {
    return invalid_argument("bad " + std::string(kind) + " '" + std::string(whole) +
                            "': " + std::string(why));
  };
  std::string host;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return bad("unterminated '[' in the host");
    }
    std::string_view v6 = rest.substr(1, close - 1);
    if (v6.empty()) {
      return bad("empty IPv6 host");
    }
    for (char c : v6) {
      if (!is_ipv6_char(c)) {
        return bad("bad character in the IPv6 host");
      }
    }
    host = std::string(v6);
    rest.remove_prefix(close + 1);
    if (rest.empty() || rest.front() != ':') {
      return bad("expected ':PORT' after the host");
    }
    port_text = rest.substr(1);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) {
      return bad("missing ':PORT'");
    }
    std::string_view h = rest.substr(0, colon);
    if (h.empty()) {
      return bad("empty host");
    }
    if (h.size() > 253) {
      return bad("host longer than 253 characters");
    }
    for (char c : h) {
      if (!is_host_char(c)) {
        return bad("bad character '" + std::string(1, c) + "' in the host");
      }
    }
    host = std::string(h);
    port_text = rest.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > 5) {
    return bad("the port must be 1 to 5 digits");
  }
  int port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') {
      return bad("the port must be digits only");
    }
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) {
    return bad("port " + std::to_string(port) + " is outside 1..65535");
  }
  return std::make_pair(std::move(host), port);
}

}  // namespace

Result<std::pair<std::string, int>> parse_tcp_addr(std::string_view addr) {
  constexpr std::string_view kScheme = "tcp://";
  if (addr.substr(0, kScheme.size()) != kScheme) {
    return invalid_argument("bad address '" + std::string(addr) + "': expected tcp://host:port");
  }
  return parse_host_port(addr.substr(kScheme.size()), "address", addr);
}

Result<std::pair<std::string, int>> parse_http_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return invalid_argument("bad bootstrap url '" + std::string(url) +
                            "': expected http://host:port");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') {
    rest.remove_suffix(1);
  }
  if (rest.find('/') != std::string_view::npos) {
    return invalid_argument("bad bootstrap url '" + std::string(url) +
                            "': no path allowed after host:port");
  }
  return parse_host_port(rest, "bootstrap url", url);
}

}  // namespace crescent::bootstrap
