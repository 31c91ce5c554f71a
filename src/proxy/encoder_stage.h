#pragma once
// The encoder stage of EPD (DESIGN.md §2b), run by the proxy before prefill and decode: every
// image part of a chat request goes, alone, to an encoder server (`crescent serve --role
// encode`), all at once; the items of their `ec_transfer_params` are merged in image order and
// handed to the caller, which adds them to the prefill's body. Any failure answers the client
// and nothing of P/D starts:
//   - an encoder's 4xx (bad image, too large): that status and body, unchanged;
//   - its 503 (pool full): 503; other 5xx, refused, broken or timed out (--encode-timeout-s):
//     502; each message names the encoder;
//   - the request's own deadline passing: 504;
//   - the client going away: every encoder call is closed.
// Images go round-robin over the encoders, except that an image sent before goes to the
// encoder it went to (EncoderRouter), whose pool or cache may still hold its mm_hash.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "net/http/http_server.h"
#include "proxy/proxy_metrics.h"
#include "proxy/proxy_options.h"
#include "proxy/request_rewrite.h"
#include "proxy/upstream_client.h"

namespace crescent::proxy {

// One image of a request: its content part as the client wrote it, and the key that routes it
// (a hash of the URL string; for a data: URL, of the payload after the comma).
struct ImagePart {
  Json part;
  uint64_t key = 0;
};

// The image parts (`{"type": "image_url", "image_url": {"url": ...}}` or `"image_url": "..."`)
// of every message's content array, in order. None for a body without "messages".
std::vector<ImagePart> find_image_parts(const Json& client_body);

// What one encoder is asked for one image: the client's model, that single part in one user
// message, max_tokens 1, not streamed.
std::string encoder_body(const Json& client_body, const Json& image_part);

// The items of an encoder's answer: `ec_transfer_params.items`, a non-empty array of objects
// each with a string "mm_hash". InvalidArgument naming what is missing otherwise.
Result<std::vector<Json>> parse_encoder_items(std::string_view answer_body);

// Which encoder gets an image: the one it was sent to last time (a bounded LRU of image keys),
// else the next in round-robin. Thread-safe.
class EncoderRouter {
 public:
  EncoderRouter(size_t num_encoders, size_t max_entries);

  struct Pick {
    int encoder_index = 0;
    bool is_affinity = false;  // the image was sent to this encoder before
  };
  // Picks and remembers the encoder for `key`.
  Pick pick(uint64_t key);
  // Forgets `key` if it maps to `encoder_index` (that encoder failed it).
  void forget(uint64_t key, int encoder_index);
  size_t size() const;

 private:
  const size_t num_encoders_;
  const size_t max_entries_;
  mutable std::mutex mu_;
  uint64_t next_ = 0;  // guarded by mu_
  // Most recently used first; guarded by mu_.
  std::list<std::pair<uint64_t, int>> lru_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, int>>::iterator> index_;
};

// Everything one encoder stage needs, decided by the caller (ProxyServer).
struct EncodePlan {
  ApiEndpoint endpoint = ApiEndpoint::kChatCompletions;
  std::string request_id;
  Deadline request_deadline = Deadline::never();  // the whole request's (--request-timeout)
  Deadline encode_deadline = Deadline::never();   // each encoder call's (also request's)
  double encode_timeout_s = 60;                   // for messages
  std::vector<ImagePart> images;
  Json client_body;  // the client's body, for encoder_body()
  std::string authorization;
  const std::vector<UpstreamUrl>* encoders = nullptr;  // outlives the stage
  EncoderRouter* router = nullptr;                     // outlives the stage
  // Runs once, with the merged items in image order, when every encoder answered; the stage
  // is still counted in flight while it runs. Not run on failure or client disconnect.
  std::function<void(Json items)> on_encoded;
  // Runs once when the stage failed or the client left (the caller frees the request id).
  std::function<void()> on_failed;
};

// Starts the stage; returns at once. `upstream` and `metrics` must outlive it.
void start_encoder_stage(EncodePlan plan, UpstreamClient* upstream, ProxyMetrics* metrics,
                         std::shared_ptr<net::http::ResponseWriter> writer);

}  // namespace crescent::proxy
