#include "server/image_inputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <system_error>

#include "core/clock.h"
#include "core/errno_text.h"
#include "net/http/http_client.h"

namespace crescent::server {
namespace {

char lower_ascii(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    c = lower_ascii(c);
  }
  return out;
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && to_lower(s.substr(0, prefix.size())) == prefix;
}

// A client's string in an error message, cut short: URLs can be megabytes long.
std::string clip(std::string_view s) {
  constexpr size_t kMaxEchoBytes = 80;
  std::string out;
  for (char c : s.substr(0, kMaxEchoBytes)) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u == 0x7F ? '?' : c;
  }
  if (s.size() > kMaxEchoBytes) {
    out += "...";
  }
  return out;
}

// One byte as an error message shows it: 'x' when printable, \xNN otherwise.
std::string show_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) {
    return std::string("'") + c + "'";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 0xF];
}

std::string too_large_message(std::string_view what, int64_t size, int64_t limit) {
  return std::string(what) + " is " + std::to_string(size) + " bytes, more than the limit of " +
         std::to_string(limit) + " bytes";
}

// ---- base64 ----
// A strict RFC 4648 §4 decoder of our own: nothing crescent links offers one as public API
// (Boost.Beast's boost::beast::detail::base64 is an internal detail namespace; OpenSSL is not
// linked, and its EVP_DecodeBlock is lenient about padding anyway), and the rules wanted here
// are few. Strict: the standard alphabet only, '=' padding required and only at the end, pad
// bits zero. Tolerated: ASCII whitespace anywhere, which browsers' atob() skips and which
// line-wrapped encoders (MIME, `base64` without -w0) emit.

constexpr std::array<int8_t, 256> make_base64_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) {
    v = -1;
  }
  constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) {
    t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  }
  return t;
}
constexpr std::array<int8_t, 256> kBase64Values = make_base64_table();

bool is_ascii_whitespace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

Result<std::vector<uint8_t>> decode_base64(std::string_view data, int64_t max_bytes) {
  // First pass: check every character and the padding, and size the output, before allocating.
  size_t num_chars = 0;  // significant characters, padding included
  size_t num_padding = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const char c = data[i];
    if (is_ascii_whitespace(c)) {
      continue;
    }
    ++num_chars;
    if (c == '=') {
      ++num_padding;
      continue;
    }
    if (kBase64Values[static_cast<unsigned char>(c)] < 0) {
      return invalid_argument("image data URL: invalid base64 character " + show_byte(c) +
                              " at offset " + std::to_string(i) + " of the data");
    }
    if (num_padding > 0) {
      return invalid_argument("image data URL: base64 data continues after '=' padding (offset " +
                              std::to_string(i) + ")");
    }
  }
  if (num_chars == 0) {
    return invalid_argument("image data URL has no data");
  }
  if (num_chars % 4 != 0) {
    return invalid_argument("image data URL: base64 length " + std::to_string(num_chars) +
                            " is not a multiple of 4 (is the '=' padding missing?)");
  }
  if (num_padding > 2) {
    return invalid_argument("image data URL: more than two '=' padding characters");
  }
  const size_t num_bytes = num_chars / 4 * 3 - num_padding;
  if (num_bytes == 0) {
    return invalid_argument("image data URL has no data");
  }
  if (static_cast<int64_t>(num_bytes) > max_bytes) {
    return invalid_argument(
        too_large_message("the image in the data URL", static_cast<int64_t>(num_bytes), max_bytes));
  }

  std::vector<uint8_t> out;
  out.reserve(num_bytes);
  uint32_t group = 0;
  int num_in_group = 0;
  for (const char c : data) {
    if (is_ascii_whitespace(c) || c == '=') {
      continue;
    }
    group = (group << 6) | static_cast<uint32_t>(kBase64Values[static_cast<unsigned char>(c)]);
    if (++num_in_group == 4) {
      out.push_back(static_cast<uint8_t>(group >> 16));
      out.push_back(static_cast<uint8_t>(group >> 8));
      out.push_back(static_cast<uint8_t>(group));
      group = 0;
      num_in_group = 0;
    }
  }
  // The last group, shortened by its padding: 3 sextets carry 2 bytes and 2 spare bits,
  // 2 sextets carry 1 byte and 4 spare bits. Non-zero spare bits mean the data was not
  // produced by a base64 encoder (or was cut or corrupted).
  if (num_in_group == 3) {
    if ((group & 0x3) != 0) {
      return invalid_argument("image data URL: base64 padding bits are not zero");
    }
    out.push_back(static_cast<uint8_t>(group >> 10));
    out.push_back(static_cast<uint8_t>(group >> 2));
  } else if (num_in_group == 2) {
    if ((group & 0xF) != 0) {
      return invalid_argument("image data URL: base64 padding bits are not zero");
    }
    out.push_back(static_cast<uint8_t>(group >> 4));
  }
  return out;
}

// data:[<media type>][;<param>]*;base64,<data> (RFC 2397). The media type may be left out
// ("data:;base64,", which some clients send); otherwise it must be image/<subtype>.
Result<std::vector<uint8_t>> fetch_data_url(std::string_view url,
                                            const ImageFetchOptions& options) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    return invalid_argument("image data URL has no ',' before its data");
  }
  const std::string header = to_lower(url.substr(5, comma - 5));
  std::vector<std::string_view> fields;
  for (size_t pos = 0;;) {
    const size_t semi = header.find(';', pos);
    fields.push_back(std::string_view(header).substr(pos, semi - pos));
    if (semi == std::string::npos) {
      break;
    }
    pos = semi + 1;
  }
  if (fields.size() < 2 || fields.back() != "base64") {
    return invalid_argument(
        "only base64 image data URLs are supported (data:image/<type>;base64,...)");
  }
  const std::string_view media_type = fields.front();
  if (!media_type.empty() && (media_type.substr(0, 6) != "image/" || media_type.size() == 6 ||
                              media_type.find_first_of(" \t/", 6) != std::string_view::npos)) {
    return invalid_argument("image data URL: media type '" + clip(media_type) +
                            "' is not an image type (image/...)");
  }
  return decode_base64(url.substr(comma + 1), options.max_image_bytes);
}

// ---- file:// ----

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  c = lower_ascii(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

Result<std::string> percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return invalid_argument("image file URL has a bad percent escape");
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  if (out.find('\0') != std::string::npos) {
    return invalid_argument("image file URL contains a NUL byte");
  }
  return out;
}

Result<std::string> real_path(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(path.c_str(), nullptr),
                                                       &std::free);
  if (resolved == nullptr) {
    const int err = errno;
    return Status(
        err == ENOENT || err == ENOTDIR ? StatusCode::kNotFound : StatusCode::kInvalidArgument,
        errno_text(err));
  }
  return std::string(resolved.get());
}

// Whether `path` is `dir` or lies below it; both absolute and normalised.
bool is_within(std::string_view path, std::string_view dir) {
  if (dir == "/") {
    return true;
  }
  return path.substr(0, dir.size()) == dir &&
         (path.size() == dir.size() || path[dir.size()] == '/');
}

Result<std::vector<uint8_t>> fetch_file_url(std::string_view url,
                                            const ImageFetchOptions& options) {
  if (options.allowed_local_media_path.empty()) {
    return invalid_argument(
        "file:// image URLs are disabled; start the server with --allowed-local-media-path DIR "
        "to allow images from files under DIR");
  }
  // file://[localhost]/abs/path (RFC 8089); a query or fragment has no meaning for a file.
  std::string_view rest = url.substr(5);
  if (rest.substr(0, 2) != "//") {
    return invalid_argument("image file URL must look like file:///absolute/path");
  }
  rest.remove_prefix(2);
  const size_t slash = rest.find('/');
  const std::string host = to_lower(rest.substr(0, slash));
  if (slash == std::string_view::npos || (!host.empty() && host != "localhost")) {
    return invalid_argument(
        "image file URL must name a local absolute path (file:///path or file://localhost/path)");
  }
  if (rest.find_first_of("?#") != std::string_view::npos) {
    return invalid_argument("image file URL must not have a query or fragment");
  }
  ASSIGN_OR_RETURN(std::string path, percent_decode(rest.substr(slash)));
  const std::string shown = clip(path);

  auto allowed = real_path(options.allowed_local_media_path);
  if (!allowed.is_ok()) {
    return invalid_argument("the allowed local media path cannot be resolved: " +
                            allowed.status().message());
  }
  // A path that is outside the directory before any symlink is followed is refused before it
  // is looked at, so that the answer says nothing about files elsewhere.
  namespace fs = std::filesystem;
  const std::string lexical = fs::path(path).lexically_normal().string();
  const std::string given = fs::path(options.allowed_local_media_path).lexically_normal().string();
  auto strip_slash = [](std::string s) {
    while (s.size() > 1 && s.back() == '/') {
      s.pop_back();
    }
    return s;
  };
  if (!is_within(strip_slash(lexical), *allowed) &&
      !is_within(strip_slash(lexical), strip_slash(given))) {
    return invalid_argument("image file " + shown + " is outside the allowed local media path");
  }
  auto resolved = real_path(path);
  if (!resolved.is_ok()) {
    if (resolved.status().code() == StatusCode::kNotFound) {
      return invalid_argument("image file " + shown + " does not exist");
    }
    return invalid_argument("image file " + shown + ": " + resolved.status().message());
  }
  if (!is_within(*resolved, *allowed)) {
    return invalid_argument("image file " + shown +
                            " resolves (through a symlink) outside the allowed local media path");
  }

  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(resolved->c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    return invalid_argument("cannot open image file " + shown + ": " + errno_text(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return invalid_argument("cannot stat image file " + shown + ": " + errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    return invalid_argument("image file " + shown + " is a directory");
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("image file " + shown + " is not a regular file");
  }
  if (st.st_size > options.max_image_bytes) {
    return invalid_argument(
        too_large_message("image file " + shown, st.st_size, options.max_image_bytes));
  }
  if (st.st_size == 0) {
    return invalid_argument("image file " + shown + " is empty");
  }
  // Read to EOF, not st_size bytes: the file may change under us, and must still fit.
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size) + 1);
  size_t num_read = 0;
  while (true) {
    if (num_read == bytes.size()) {
      if (static_cast<int64_t>(num_read) > options.max_image_bytes) {
        return invalid_argument("image file " + shown + " grew past the limit of " +
                                std::to_string(options.max_image_bytes) + " bytes while read");
      }
      bytes.resize(
          std::min<size_t>(bytes.size() * 2, static_cast<size_t>(options.max_image_bytes) + 1));
    }
    const ssize_t n = ::read(fd, bytes.data() + num_read, bytes.size() - num_read);
    const int err = errno;
    if (n < 0 && err == EINTR) {
      continue;
    }
    if (n < 0) {
      return invalid_argument("cannot read image file " + shown + ": " + errno_text(err));
    }
    if (n == 0) {
      break;
    }
    num_read += static_cast<size_t>(n);
  }
  bytes.resize(num_read);
  if (bytes.empty()) {
    return invalid_argument("image file " + shown + " is empty");
  }
  return bytes;
}

// ---- http:// ----

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string target;  // "/path?query"
};

Result<HttpUrl> parse_http_url(std::string_view url) {
  for (char c : url) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7F) {
      return invalid_argument("image URL contains a space, control or non-ASCII byte " +
                              show_byte(c) + " (percent-encode it)");
    }
  }
  std::string_view rest = url.substr(7);  // after "http://"
  const size_t authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  std::string_view target =
      authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  target = target.substr(0, target.find('#'));
  if (authority.find('@') != std::string_view::npos) {
    return invalid_argument("image URL must not carry credentials (user@host)");
  }
  HttpUrl out;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return invalid_argument("image URL has a bad IPv6 host: " + clip(url));
    }
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return invalid_argument("image URL has a bad host: " + clip(url));
      }
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
    }
  }
  if (out.host.empty()) {
    return invalid_argument("image URL has no host: " + clip(url));
  }
  if (!port.empty()) {
    int value = 0;
    for (char c : port) {
      if (c < '0' || c > '9' || value > 65535) {
        return invalid_argument("image URL has a bad port: " + clip(url));
      }
      value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535) {
      return invalid_argument("image URL has a bad port: " + clip(url));
    }
    out.port = value;
  }
  if (target.empty() || target.front() != '/') {
    out.target = "/";  // "http://host" and "http://host?q" ask for the root
  }
  out.target.append(target);
  return out;
}

Result<std::vector<uint8_t>> fetch_http_url(std::string_view url,
                                            const ImageFetchOptions& options) {
  ASSIGN_OR_RETURN(HttpUrl parsed, parse_http_url(url));
  const std::string shown = clip(url);
  net::http::HttpClient client(parsed.host, parsed.port);
  std::vector<uint8_t> bytes;
  bool too_large = false;
  auto on_data = [&](std::string_view piece) {
    if (static_cast<int64_t>(bytes.size() + piece.size()) > options.max_image_bytes) {
      too_large = true;
      return false;  // closes the connection: the rest is never read
    }
    bytes.insert(bytes.end(), piece.begin(), piece.end());
    return true;
  };
  // Name resolution is not bound by the deadline (the client resolves synchronously).
  auto response = client.stream("GET", parsed.target, "", {{"accept", "image/*"}}, on_data,
                                Deadline::after_ms(options.remote_timeout_ms));
  if (!response.is_ok()) {
    if (response.status().code() == StatusCode::kDeadlineExceeded) {
      return deadline_exceeded("fetching image URL " + shown + " took longer than " +
                               std::to_string(options.remote_timeout_ms) + " ms");
    }
    return invalid_argument("cannot fetch image URL " + shown + ": " + response.status().message());
  }
  const int status = response->status;
  if (status >= 300 && status < 400) {
    return invalid_argument("image URL " + shown + " answered with a redirect (HTTP " +
                            std::to_string(status) + "), which is not followed");
  }
  if (status != 200) {
    return invalid_argument("image URL " + shown + " answered HTTP " + std::to_string(status));
  }
  if (too_large) {
    return invalid_argument("the image at " + shown + " is larger than the limit of " +
                            std::to_string(options.max_image_bytes) + " bytes");
  }
  if (bytes.empty()) {
    return invalid_argument("the image at " + shown + " is empty");
  }
  return bytes;
}

}  // namespace

Status validate_image_fetch_options(const ImageFetchOptions& options) {
  if (options.max_image_bytes <= 0) {
    return invalid_argument("the image size limit must be positive");
  }
  if (options.remote_timeout_ms <= 0) {
    return invalid_argument("the remote image timeout must be positive");
  }
  if (!options.allowed_local_media_path.empty()) {
    struct stat st {};
    if (::stat(options.allowed_local_media_path.c_str(), &st) != 0) {
      const int err = errno;
      return invalid_argument("--allowed-local-media-path " + options.allowed_local_media_path +
                              ": " + errno_text(err));
    }
    if (!S_ISDIR(st.st_mode)) {
      return invalid_argument("--allowed-local-media-path " + options.allowed_local_media_path +
                              " is not a directory");
    }
  }
  return Status::ok();
}

Result<std::vector<uint8_t>> fetch_image_bytes(std::string_view url,
                                               const ImageFetchOptions& options) {
  if (starts_with_nocase(url, "data:")) {
    return fetch_data_url(url, options);
  }
  if (starts_with_nocase(url, "file:")) {
    return fetch_file_url(url, options);
  }
  const bool is_http = starts_with_nocase(url, "http://");
  if (is_http || starts_with_nocase(url, "https://")) {
    if (!options.allow_remote) {
      return invalid_argument(
          "remote image URLs are disabled; start the server with --allow-remote-media to fetch "
          "http(s) images, or send the image inline as a data:image/...;base64 URL");
    }
    if (!is_http) {
      return invalid_argument(
          "https image URLs are not supported: crescent's HTTP client has no TLS; send the image "
          "inline as a data:image/...;base64 URL, or over plain http://");
    }
    return fetch_http_url(url, options);
  }
  if (starts_with_nocase(url, "ec://")) {
    return invalid_argument(
        "image URL '" + clip(url) +
        "' names an encoder output, not an image: crescent's proxy sends such URLs to decode "
        "servers together with ec_transfer_params items that give each image's mm_hash and "
        "grid; this request's items are missing or do not describe its images");
  }
  return invalid_argument("unsupported image URL '" + clip(url) +
                          "': use a data:image/...;base64 URL, file:// or http(s)://");
}

}  // namespace crescent::server
