#include "proxy/request_rewrite.h"

#include <string>
#include <vector>

#include "core/ids.h"
#include "core/json.h"

namespace crescent::proxy {
namespace {

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

Result<Json> parse_client_body(std::string_view body) {
  if (body.empty()) {
    return invalid_argument("the request body is empty; expected a JSON object");
  }
  ASSIGN_OR_RETURN(Json j, parse_json<Json>(body, "the request body"));
  if (!j.is_object()) {
    return invalid_argument("the request body must be a JSON object");
  }
  return j;
}

Result<std::string> request_id_for(const net::http::Request& request) {
  auto it = request.headers.find("x-request-id");
  if (it == request.headers.end()) {
    return random_uuid();
  }
  const std::string& id = it->second;
  if (id.empty() || id.size() > 256) {
    return invalid_argument("X-Request-Id must have 1 to 256 characters");
  }
  for (char c : id) {
    if (c < 0x21 || c > 0x7e) {
      return invalid_argument("X-Request-Id may only hold visible ASCII characters");
    }
  }
  return id;
}

std::string transfer_id_for(std::string_view request_id) {
  return "xfer-" + std::string(request_id);
}

std::string prefill_body(const Json& client_body, std::string_view transfer_id) {
  Json j = client_body;
  j["kv_transfer_params"] =
      Json{{"do_remote_decode", true}, {"do_remote_prefill", false}, {"transfer_id", transfer_id}};
  j["stream"] = false;
  j["max_tokens"] = 1;
  if (j.contains("max_completion_tokens")) {
    j["max_completion_tokens"] = 1;
  }
  j.erase("stream_options");
  return dump(j);
}

std::string decode_body(const Json& client_body, std::string_view transfer_id,
                        const PrefillSource& source) {
  Json j = client_body;
  j["kv_transfer_params"] = Json{{"do_remote_decode", false},
                                 {"do_remote_prefill", true},
                                 {"remote_bootstrap_addr", source.bootstrap_addr},
                                 {"remote_engine_id", source.engine_id},
                                 {"transfer_id", transfer_id}};
  return dump(j);
}

namespace {

// Every image_url part's url string of a chat body (either form), in message and part order.
std::vector<Json*> image_urls_of(Json& body) {
  std::vector<Json*> urls;
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    return urls;
  }
  for (Json& message : *messages) {
    auto content = message.is_object() ? message.find("content") : message.end();
    if (!message.is_object() || content == message.end() || !content->is_array()) {
      continue;
    }
    for (Json& part : *content) {
      if (!part.is_object() || part.value("type", "") != "image_url") {
        continue;
      }
      auto image = part.find("image_url");
      if (image != part.end() && image->is_string()) {
        urls.push_back(&*image);  // the short form: "image_url": "URL"
        continue;
      }
      if (image == part.end() || !image->is_object()) {
        continue;
      }
      auto url = image->find("url");
      if (url != image->end() && url->is_string()) {
        urls.push_back(&*url);
      }
    }
  }
  return urls;
}

}  // namespace

bool replace_image_urls_with_ec_refs(Json& body, const Json& items) {
  if (!body.is_object() || !items.is_array()) {
    return false;
  }
  std::vector<Json*> urls = image_urls_of(body);
  if (urls.empty() || urls.size() != items.size()) {
    return false;
  }
  std::vector<std::string> refs;
  refs.reserve(items.size());
  for (const Json& item : items) {
    auto hash = item.is_object() ? item.find("mm_hash") : item.end();
    if (!item.is_object() || hash == item.end() || !hash->is_string()) {
      return false;
    }
    refs.push_back(std::string(kEcImageUrlScheme) + hash->get<std::string>());
  }
  for (size_t i = 0; i < urls.size(); ++i) {
    *urls[i] = std::move(refs[i]);
  }
  return true;
}

net::http::Headers prefill_headers(std::string_view request_id, int dp_rank,
                                   std::string_view authorization) {
  net::http::Headers h = decode_headers(request_id, authorization);
  h["X-data-parallel-rank"] = std::to_string(dp_rank);
  return h;
}

net::http::Headers decode_headers(std::string_view request_id, std::string_view authorization) {
  net::http::Headers h;
  h["Content-Type"] = "application/json";
  h["X-Request-Id"] = std::string(request_id);
  if (!authorization.empty()) {
    h["Authorization"] = std::string(authorization);
  }
  return h;
}

}  // namespace crescent::proxy
