#pragma once
// The OpenAI server's endpoints beside generation that vLLM also serves, and crescent's KV
// event feed (docs/server.md):
//
//   POST /tokenize      {"prompt": "..."} or {"messages": [...]} (+ "add_special_tokens",
//                       crescent's "return_block_hashes": true)
//                       -> {"count", "max_model_len", "tokens", "token_strs": null
//                           [, "block_size", "block_hashes"]}
//   POST /detokenize    {"tokens": [...]} -> {"prompt": "..."}
//   GET  /v1/kv_events?since=SEQ[&engine_id=ID]
//                       -> {"engine_id", "block_size", "seq", "reset", "events": [...]}
//
// Each answers a status and a JSON body; errors are OpenAI-shaped (openai_protocol.h).

#include <string>
#include <string_view>

#include "server/engine_client.h"

namespace crescent::server {

struct EndpointReply {
  int status = 200;
  std::string body;
};

EndpointReply tokenize_reply(const EngineClient& engine, const std::string& body);
EndpointReply detokenize_reply(const EngineClient& engine, const std::string& body);
// query: the target's query string, without '?'.
EndpointReply kv_events_reply(const EngineClient& engine, std::string_view query);

}  // namespace crescent::server
