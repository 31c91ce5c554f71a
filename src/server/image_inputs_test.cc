#include "server/image_inputs.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace crescent::server {
namespace {

namespace fs = std::filesystem;

std::string as_string(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

// The bytes of `url`, or "ERROR <message>".
std::string fetch(std::string_view url, const ImageFetchOptions& options = {}) {
  auto r = fetch_image_bytes(url, options);
  if (!r.is_ok()) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    return "ERROR " + r.status().message();
  }
  return as_string(*r);
}

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST(ImageInputsTest, DataUrlDecodes) {
  // RFC 4648 §10 test vectors.
  EXPECT_EQ(fetch("data:image/png;base64,Zg=="), "f");
  EXPECT_EQ(fetch("data:image/png;base64,Zm8="), "fo");
  EXPECT_EQ(fetch("data:image/png;base64,Zm9v"), "foo");
  EXPECT_EQ(fetch("data:image/png;base64,Zm9vYg=="), "foob");
  EXPECT_EQ(fetch("data:image/png;base64,Zm9vYmE="), "fooba");
  EXPECT_EQ(fetch("data:image/png;base64,Zm9vYmFy"), "foobar");
  // All 256 byte values, and the characters '+' and '/'.
  EXPECT_EQ(fetch("data:image/jpeg;base64,AP8+/w=="), std::string("\x00\xff\x3e\xff", 4));
  // Whitespace anywhere in the data, as browsers' atob() and line-wrapping encoders have it.
  EXPECT_EQ(fetch("data:image/png;base64,Zm9v\r\nYm Fy\n"), "foobar");
  EXPECT_EQ(fetch("data:image/png;base64,\tZm8\n=\n"), "fo");
  // Media types: any image/*, none at all, extra parameters, any case.
  EXPECT_EQ(fetch("data:image/webp;base64,Zm9v"), "foo");
  EXPECT_EQ(fetch("data:;base64,Zm9v"), "foo");
  EXPECT_EQ(fetch("data:image/png;name=cat.png;base64,Zm9v"), "foo");
  EXPECT_EQ(fetch("DATA:Image/PNG;BASE64,Zm9v"), "foo");
}

TEST(ImageInputsTest, DataUrlRefusesBadData) {
  struct Case {
    std::string url;
    std::string_view message_part;
  };
  const Case cases[] = {
      {"data:image/png;base64,", "no data"},
      {"data:image/png;base64, \n ", "no data"},
      {"data:image/png;base64,====", "padding"},
      {"data:image/png;base64,Zm8", "multiple of 4"},
      {"data:image/png;base64,Zg=", "multiple of 4"},
      {"data:image/png;base64,Zg===", "multiple of 4"},
      {"data:image/png;base64,Z===", "padding"},
      {"data:image/png;base64,Zg==Zm9v", "after '=' padding"},
      {"data:image/png;base64,Zm9v!A==", "invalid base64 character '!' at offset 4"},
      {"data:image/png;base64,Zm9-", "invalid base64 character '-'"},  // base64url
      {"data:image/png;base64,Zm9_", "invalid base64 character '_'"},
      {std::string("data:image/png;base64,Zm\x01v"), "\\x01"},
      {"data:image/png;base64,Zm9%3D", "'%'"},
      {"data:image/png;base64,Zm9=", "padding bits"},  // canonical: Zm8=
      {"data:image/png;base64,Zh==", "padding bits"},  // canonical: Zg==
      {"data:image/png;base64", "no ','"},
      {"data:image/png,Zm9v", "only base64"},
      {"data:,Zm9v", "only base64"},
      {"data:text/plain;base64,Zm9v", "'text/plain' is not an image type"},
      {"data:image;base64,Zm9v", "not an image type"},
      {"data:image/;base64,Zm9v", "not an image type"},
  };
  for (const Case& c : cases) {
    const std::string got = fetch(c.url);
    EXPECT_TRUE(has(got, "ERROR ")) << c.url;
    EXPECT_TRUE(has(got, c.message_part)) << c.url << " -> " << got;
  }
}

TEST(ImageInputsTest, DataUrlErrorsDoNotEchoTheData) {
  std::string url = "data:image/png;base64," + std::string(3 << 20, 'A') + "*AAA";
  const std::string got = fetch(url);
  EXPECT_TRUE(has(got, "'*'")) << got.substr(0, 200);
  EXPECT_LT(got.size(), 200u);
  const std::string media = "data:" + std::string(1 << 20, 'x') + ";base64,Zm9v";
  const std::string media_error = fetch(media);
  EXPECT_TRUE(has(media_error, "not an image type"));
  EXPECT_LT(media_error.size(), 300u);
}

TEST(ImageInputsTest, DataUrlSizeLimit) {
  ImageFetchOptions options;
  options.max_image_bytes = 6;
  EXPECT_EQ(fetch("data:image/png;base64,Zm9vYmFy", options), "foobar");
  options.max_image_bytes = 5;
  const std::string got = fetch("data:image/png;base64,Zm9vYmFy", options);
  EXPECT_TRUE(has(got, "6 bytes, more than the limit of 5 bytes")) << got;
}

class ImageFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/image_inputs_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    allowed_ = root_ + "/allowed";
    fs::create_directories(allowed_ + "/sub/deeper");
    fs::create_directories(root_ + "/allowed2");
    write(allowed_ + "/cat.png", "PNGDATA");
    write(allowed_ + "/my cat.png", "SPACED");
    write(allowed_ + "/empty.png", "");
    write(allowed_ + "/big.png", std::string(101, 'b'));
    write(root_ + "/outside.png", "SECRET");
    write(root_ + "/allowed2/x.png", "NEIGHBOUR");
    fs::create_symlink(root_ + "/outside.png", allowed_ + "/escape.png");
    fs::create_symlink("../outside.png", allowed_ + "/escape_relative.png");
    fs::create_symlink("cat.png", allowed_ + "/alias.png");
    fs::create_symlink(root_, allowed_ + "/sub/up");
    fs::create_symlink(allowed_, root_ + "/allowed_link");
    ASSERT_EQ(::mkfifo((allowed_ + "/pipe.png").c_str(), 0600), 0);
    options_.allowed_local_media_path = allowed_;
    options_.max_image_bytes = 100;
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary) << data;
  }
  std::string url(const std::string& path) const { return "file://" + path; }

  std::string root_;
  std::string allowed_;
  ImageFetchOptions options_;
};

TEST_F(ImageFileTest, ReadsFilesInsideTheAllowedDirectory) {
  EXPECT_EQ(fetch(url(allowed_ + "/cat.png"), options_), "PNGDATA");
  EXPECT_EQ(fetch("file://localhost" + allowed_ + "/cat.png", options_), "PNGDATA");
  EXPECT_EQ(fetch(url(allowed_ + "/my%20cat.png"), options_), "SPACED");
  // `..` and symlinks that stay inside are fine.
  EXPECT_EQ(fetch(url(allowed_ + "/sub/../cat.png"), options_), "PNGDATA");
  EXPECT_EQ(fetch(url(allowed_ + "/alias.png"), options_), "PNGDATA");
  EXPECT_EQ(fetch(url(allowed_ + "/sub/up/allowed/cat.png"), options_), "PNGDATA");
  // The allowed directory named through a symlink or with a trailing slash.
  ImageFetchOptions via_link = options_;
  via_link.allowed_local_media_path = root_ + "/allowed_link/";
  EXPECT_EQ(fetch(url(root_ + "/allowed_link/cat.png"), via_link), "PNGDATA");
  EXPECT_EQ(fetch(url(allowed_ + "/cat.png"), via_link), "PNGDATA");
}

TEST_F(ImageFileTest, RefusesFilesOutsideTheAllowedDirectory) {
  EXPECT_TRUE(has(fetch(url(root_ + "/outside.png"), options_), "outside the allowed"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/../outside.png"), options_), "outside the allowed"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/sub/../../outside.png"), options_), "outside"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "%2F..%2F..%2Foutside.png"), options_), "outside"));
  EXPECT_TRUE(has(fetch(url(root_ + "/allowed2/x.png"), options_), "outside"));
  EXPECT_TRUE(has(fetch(url("/etc/passwd"), options_), "outside"));
  // Symlinks inside that lead out.
  EXPECT_TRUE(has(fetch(url(allowed_ + "/escape.png"), options_), "through a symlink"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/escape_relative.png"), options_), "through a symlink"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/sub/up/outside.png"), options_), "through a symlink"));
}

TEST_F(ImageFileTest, RefusesWhatIsNotAnImageFile) {
  EXPECT_TRUE(has(fetch(url(allowed_ + "/sub"), options_), "is a directory"));
  EXPECT_TRUE(has(fetch(url(allowed_), options_), "is a directory"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/missing.png"), options_), "does not exist"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/cat.png/x"), options_), "does not exist"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/empty.png"), options_), "is empty"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/pipe.png"), options_), "not a regular file"));
  const std::string big = fetch(url(allowed_ + "/big.png"), options_);
  EXPECT_TRUE(has(big, "101 bytes, more than the limit of 100 bytes")) << big;
  options_.max_image_bytes = 101;
  EXPECT_EQ(fetch(url(allowed_ + "/big.png"), options_), std::string(101, 'b'));
}

TEST_F(ImageFileTest, RefusesBadFileUrls) {
  EXPECT_TRUE(has(fetch(url(allowed_ + "/cat.png"), {}), "--allowed-local-media-path"));
  EXPECT_TRUE(has(fetch("file:" + allowed_ + "/cat.png", options_), "file:///"));
  EXPECT_TRUE(has(fetch("file://example.com" + allowed_ + "/cat.png", options_), "local"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/cat.png?x=1"), options_), "query"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/cat.png%"), options_), "percent escape"));
  EXPECT_TRUE(has(fetch(url(allowed_ + "/cat.png%00"), options_), "NUL"));
  ImageFetchOptions missing_dir = options_;
  missing_dir.allowed_local_media_path = root_ + "/nowhere";
  EXPECT_TRUE(has(fetch(url(root_ + "/nowhere/cat.png"), missing_dir), "cannot be resolved"));
}

TEST_F(ImageFileTest, ValidatesOptions) {
  EXPECT_TRUE(validate_image_fetch_options(options_).is_ok());
  EXPECT_TRUE(validate_image_fetch_options({}).is_ok());
  ImageFetchOptions bad = options_;
  bad.allowed_local_media_path = allowed_ + "/cat.png";
  EXPECT_FALSE(validate_image_fetch_options(bad).is_ok());
  bad.allowed_local_media_path = root_ + "/nowhere";
  EXPECT_FALSE(validate_image_fetch_options(bad).is_ok());
  bad = options_;
  bad.max_image_bytes = 0;
  EXPECT_FALSE(validate_image_fetch_options(bad).is_ok());
  bad = options_;
  bad.remote_timeout_ms = 0;
  EXPECT_FALSE(validate_image_fetch_options(bad).is_ok());
}

// Serves one canned response to the first connection on 127.0.0.1, or, with hold_ms, answers
// nothing for that long (or until the client hangs up).
class OneShotServer {
 public:
  explicit OneShotServer(std::string response, int hold_ms = 0) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 1), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ =
        std::thread([this, response = std::move(response), hold_ms] { serve(response, hold_ms); });
  }
  ~OneShotServer() {
    if (thread_.joinable()) {
      thread_.join();
    }
    ::close(listen_fd_);
  }

  int port() const { return port_; }
  // The request the server read (waits for the server to finish).
  std::string request() {
    if (thread_.joinable()) {
      thread_.join();
    }
    return request_;
  }

 private:
  static bool wait_readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1;
  }

  void serve(const std::string& response, int hold_ms) {
    if (!wait_readable(listen_fd_, 5000)) {
      return;
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      return;
    }
    char buf[4096];
    while (request_.find("\r\n\r\n") == std::string::npos && wait_readable(fd, 2000)) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        break;
      }
      request_.append(buf, static_cast<size_t>(n));
    }
    if (hold_ms > 0) {
      // Until the client gives up (EOF) or hold_ms passes.
      wait_readable(fd, hold_ms);
    } else {
      size_t sent = 0;
      while (sent < response.size()) {
        const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) {
          break;  // the client stopped reading (a size limit) and closed
        }
        sent += static_cast<size_t>(n);
      }
      ::shutdown(fd, SHUT_WR);
      while (wait_readable(fd, 1000) && ::recv(fd, buf, sizeof(buf), 0) > 0) {
      }
    }
    ::close(fd);
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::string request_;
};

std::string http_response(int status, const std::string& body,
                          const std::string& extra_headers = "") {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: image/png\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

ImageFetchOptions remote_options() {
  ImageFetchOptions options;
  options.allow_remote = true;
  options.max_image_bytes = 1000;
  options.remote_timeout_ms = 2000;
  return options;
}

TEST(ImageInputsTest, RemoteUrlsNeedTheFlag) {
  for (const char* u : {"http://127.0.0.1:1/cat.png", "https://example.com/cat.png",
                        "HTTP://127.0.0.1:1/cat.png"}) {
    const std::string got = fetch(u);
    EXPECT_TRUE(has(got, "remote image URLs are disabled")) << got;
    EXPECT_TRUE(has(got, "--allow-remote-media")) << got;
  }
  EXPECT_TRUE(has(fetch("https://example.com/cat.png", remote_options()), "no TLS"));
  EXPECT_TRUE(has(fetch("ftp://example.com/cat.png", remote_options()), "unsupported image URL"));
  EXPECT_TRUE(has(fetch("cat.png"), "unsupported image URL"));
  EXPECT_TRUE(has(fetch(""), "unsupported image URL"));
  EXPECT_TRUE(has(fetch("ec://0123abcd"), "names an encoder output"));
}

TEST(ImageInputsTest, RemoteFetch) {
  OneShotServer server(http_response(200, "IMAGEBYTES"));
  const std::string u =
      "http://127.0.0.1:" + std::to_string(server.port()) + "/images/cat.png?size=2#frag";
  EXPECT_EQ(fetch(u, remote_options()), "IMAGEBYTES");
  const std::string request = server.request();
  EXPECT_EQ(request.substr(0, request.find("\r\n")), "GET /images/cat.png?size=2 HTTP/1.1");
  EXPECT_TRUE(has(request, "\r\naccept: image/*\r\n") || has(request, "\r\nAccept: image/*\r\n"))
      << request;
}

TEST(ImageInputsTest, RemoteFetchChunked) {
  OneShotServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      "4\r\nIMAG\r\n6\r\nEBYTES\r\n0\r\n\r\n");
  EXPECT_EQ(fetch("http://127.0.0.1:" + std::to_string(server.port()), remote_options()),
            "IMAGEBYTES");
  EXPECT_EQ(server.request().substr(0, 14), "GET / HTTP/1.1");
}

TEST(ImageInputsTest, RemoteFetchRefusesBadAnswers) {
  {
    OneShotServer server(http_response(404, "not here"));
    const std::string got =
        fetch("http://127.0.0.1:" + std::to_string(server.port()) + "/x.png", remote_options());
    EXPECT_TRUE(has(got, "HTTP 404")) << got;
  }
  {
    OneShotServer server(http_response(302, "", "Location: http://169.254.169.254/\r\n"));
    const std::string got =
        fetch("http://127.0.0.1:" + std::to_string(server.port()) + "/x.png", remote_options());
    EXPECT_TRUE(has(got, "redirect")) << got;
  }
  {
    OneShotServer server(http_response(200, ""));
    const std::string got =
        fetch("http://127.0.0.1:" + std::to_string(server.port()) + "/x.png", remote_options());
    EXPECT_TRUE(has(got, "empty")) << got;
  }
  {
    // Larger than the limit: the client stops reading at the limit.
    OneShotServer server(http_response(200, std::string(4 << 20, 'x')));
    const std::string got =
        fetch("http://127.0.0.1:" + std::to_string(server.port()) + "/x.png", remote_options());
    EXPECT_TRUE(has(got, "larger than the limit of 1000 bytes")) << got;
  }
  {
    // Exactly at the limit is fine.
    OneShotServer server(http_response(200, std::string(1000, 'x')));
    EXPECT_EQ(fetch("http://127.0.0.1:" + std::to_string(server.port()), remote_options()),
              std::string(1000, 'x'));
  }
}

TEST(ImageInputsTest, RemoteFetchTimesOut) {
  OneShotServer server("", /*hold_ms=*/5000);
  ImageFetchOptions options = remote_options();
  options.remote_timeout_ms = 200;
  const auto start = std::chrono::steady_clock::now();
  auto r =
      fetch_image_bytes("http://127.0.0.1:" + std::to_string(server.port()) + "/slow.png", options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().to_string();
  EXPECT_TRUE(has(r.status().message(), "200 ms")) << r.status().message();
  EXPECT_LT(elapsed, std::chrono::milliseconds(2000));
}

TEST(ImageInputsTest, RemoteFetchRefusesBadUrlsAndDeadHosts) {
  const ImageFetchOptions options = remote_options();
  EXPECT_TRUE(has(fetch("http://user:pw@127.0.0.1/x.png", options), "credentials"));
  EXPECT_TRUE(has(fetch("http:///x.png", options), "no host"));
  EXPECT_TRUE(has(fetch("http://127.0.0.1:99999/x.png", options), "bad port"));
  EXPECT_TRUE(has(fetch("http://127.0.0.1:8x/x.png", options), "bad port"));
  EXPECT_TRUE(has(fetch("http://127.0.0.1/a b.png", options), "space"));
  EXPECT_TRUE(has(fetch("http://[::1/x.png", options), "IPv6"));
  // Nothing listens on a port that was bound and closed again.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  const std::string got =
      fetch("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/x.png", options);
  EXPECT_TRUE(has(got, "cannot fetch image URL")) << got;
}

}  // namespace
}  // namespace crescent::server
