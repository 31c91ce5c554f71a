#pragma once
// What the proxy sends to the prefill and the decode server for one client request (DESIGN.md
// §2): the two bodies with their kv_transfer_params, and the headers. Pure functions; the
// client's body keeps its key order and every field the proxy does not own.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"
#include "net/http/http_message.h"

namespace crescent::proxy {

// Key order is kept so that a decode server sees the client's body as it was written.
using Json = nlohmann::ordered_json;

// The client's body as a JSON object; InvalidArgument (for a 400) otherwise.
Result<Json> parse_client_body(std::string_view body);

// The client's X-Request-Id when it sent one (1 to 256 visible ASCII characters, else
// InvalidArgument), or a new uuid.
Result<std::string> request_id_for(const net::http::Request& request);

// "xfer-" + request_id: the key under which prefill and decode find each other.
std::string transfer_id_for(std::string_view request_id);

// Where the KV of one request comes from: the prefill's bootstrap server and the engine id of
// the chosen data-parallel rank.
struct PrefillSource {
  int dp_rank = 0;
  std::string engine_id;
  std::string bootstrap_addr;  // "http://HOST:BOOTSTRAP_PORT"
};

// The prefill body: max_tokens = 1 (and max_completion_tokens = 1 when present),
// stream = false, no stream_options, kv_transfer_params {do_remote_decode: true,
// do_remote_prefill: false, transfer_id}.
std::string prefill_body(const Json& client_body, std::string_view transfer_id);

// The decode body: the client's body with kv_transfer_params {do_remote_decode: false,
// do_remote_prefill: true, remote_bootstrap_addr, remote_engine_id, transfer_id}.
std::string decode_body(const Json& client_body, std::string_view transfer_id,
                        const PrefillSource& source);

// EPD: a decode server needs only each image's mm_hash and grid, which the encoders' items
// carry, so the proxy sends it no pixels: the url of the i-th image_url part becomes
// "ec://" + items[i].mm_hash (kEcImageUrlScheme), and a 3.7 MB base64 PNG costs D's core no
// 18 ms parse. False, with `body` unchanged, when the image parts and the items differ in
// number or an item has no string mm_hash.
inline constexpr std::string_view kEcImageUrlScheme = "ec://";
bool replace_image_urls_with_ec_refs(Json& body, const Json& items);

// Headers with their canonical spelling. `authorization` "" sends none.
net::http::Headers prefill_headers(std::string_view request_id, int dp_rank,
                                   std::string_view authorization);
net::http::Headers decode_headers(std::string_view request_id, std::string_view authorization);

}  // namespace crescent::proxy
