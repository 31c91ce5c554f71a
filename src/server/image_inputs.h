#pragma once
// The bytes of an image a chat request names by URL (an image_url content part): a base64 data:
// URL, a file:// URL inside the one directory the operator allows, or, when the operator allows
// it, an http:// URL. Decoding the bytes into pixels is the media module's job.
// Every failure is InvalidArgument, except a remote fetch past its time (DeadlineExceeded);
// messages name the problem without echoing the URL's data. Stateless; thread-safe.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::server {

struct ImageFetchOptions {
  // vLLM's --allowed-local-media-path: file:// URLs must resolve (symlinks and .. included)
  // inside this directory. "" refuses file:// URLs.
  std::string allowed_local_media_path;
  // http(s):// URLs (--allow-remote-media). Off by default: a server that fetches what clients
  // name can be pointed at its own network.
  bool allow_remote = false;
  // Limit on the encoded image (the PNG/JPEG/... bytes) from any source.
  int64_t max_image_bytes = 20 << 20;
  // The whole remote fetch (connect, request, response) must finish in this time.
  int remote_timeout_ms = 5000;
};

// Checks the options once at startup: the allowed directory (when set) exists and is a
// directory, the limits are positive.
Status validate_image_fetch_options(const ImageFetchOptions& options);

// The encoded image bytes that `url` names:
//   data:[image/<type>][;param]*;base64,<data>   (also "data:;base64,"; RFC 4648 base64 with
//                                                 padding, ASCII whitespace skipped)
//   file:///abs/path, file://localhost/abs/path  (percent-decoded; a regular file inside
//                                                 allowed_local_media_path)
//   http://host[:port]/path                      (allow_remote; no redirects; 200 only)
// https:// is refused: crescent's HTTP client has no TLS.
Result<std::vector<uint8_t>> fetch_image_bytes(std::string_view url,
                                               const ImageFetchOptions& options);

}  // namespace crescent::server
