#include "server/token_endpoints.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "engine/kv_events.h"
#include "server/openai_protocol.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;

EndpointReply error_reply(const ApiError& e) {
  return {e.http_status, dump_json(error_json(e))};
}

// The value of `name` in "a=1&b=2" (nullopt when absent).
std::optional<std::string_view> query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    }
    if (amp == std::string_view::npos) {
      break;
    }
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

}  // namespace

EndpointReply tokenize_reply(const EngineClient& engine, const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return error_reply(bad_request("the body is not a JSON object"));
  }
  const bool chat = j.contains("messages");
  if (chat == j.contains("prompt")) {
    return error_reply(bad_request("give exactly one of 'prompt' and 'messages'"));
  }
  bool return_hashes = false;
  if (j.contains("return_block_hashes")) {
    if (!j["return_block_hashes"].is_boolean()) {
      return error_reply(
          bad_request("'return_block_hashes' must be a boolean", "return_block_hashes"));
    }
    return_hashes = j["return_block_hashes"].get<bool>();
  }
  // As generation tokenizes: a chat's template holds its special tokens, a prompt gets them.
  bool add_special_tokens = !chat;
  if (j.contains("add_special_tokens")) {
    if (!j["add_special_tokens"].is_boolean()) {
      return error_reply(
          bad_request("'add_special_tokens' must be a boolean", "add_special_tokens"));
    }
    add_special_tokens = j["add_special_tokens"].get<bool>();
  }
  // Generation accepts only the add_special_tokens it applies itself; /tokenize applies either.
  j.erase("add_special_tokens");
  GenerationRequest req;
  if (auto e = parse_generation_request(j.dump(), chat ? Endpoint::kChat : Endpoint::kCompletions,
                                        &req)) {
    return error_reply(*e);
  }
  std::vector<int32_t> tokens;
  if (chat) {
    auto rendered = engine.render_chat(req.messages, req.chat_render);
    if (!rendered.is_ok()) {
      return error_reply(bad_request(
          "cannot apply the chat template: " + rendered.status().message(), "messages"));
    }
    auto ids = engine.tokenize(*rendered, add_special_tokens);
    if (!ids.is_ok()) {
      return error_reply(bad_request(ids.status().message(), "messages"));
    }
    tokens = std::move(ids).value();
  } else if (req.prompt_text) {
    auto ids = engine.tokenize(*req.prompt_text, add_special_tokens);
    if (!ids.is_ok()) {
      return error_reply(bad_request(ids.status().message(), "prompt"));
    }
    tokens = std::move(ids).value();
  } else {
    tokens = *req.prompt_token_ids;
  }
  json out = {{"count", tokens.size()},
              {"max_model_len", engine.max_model_len()},
              {"tokens", tokens},
              {"token_strs", nullptr}};
  if (return_hashes) {
    std::shared_ptr<const engine::KvEventLog> log = engine.kv_event_log();
    if (log == nullptr) {
      return error_reply(
          api_error(501, "'return_block_hashes' needs an engine with a KV event log (one dp rank)",
                    "not_implemented_error"));
    }
    out["block_size"] = log->block_size();
    out["block_hashes"] = engine::prefix_block_hashes(tokens, log->block_size());
  }
  return {200, dump_json(out)};
}

EndpointReply detokenize_reply(const EngineClient& engine, const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return error_reply(bad_request("the body needs 'tokens', an array of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  for (const json& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= engine.vocab_size()) {
      return error_reply(bad_request(
          "'tokens' must hold token ids in [0, " + std::to_string(engine.vocab_size()) + ")",
          "tokens"));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return {200, dump_json(json{{"prompt", engine.detokenize(ids)}})};
}

EndpointReply kv_events_reply(const EngineClient& engine, std::string_view query) {
  std::shared_ptr<const engine::KvEventLog> log = engine.kv_event_log();
  if (log == nullptr) {
    return error_reply(api_error(
        501, "this server publishes no KV events (an encoder, or --data-parallel-size above 1)",
        "not_implemented_error"));
  }
  int64_t since = 0;
  if (auto v = query_value(query, "since")) {
    auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), since);
    if (v->empty() || ec != std::errc() || ptr != v->data() + v->size() || since < 0) {
      return error_reply(bad_request("'since' must be a non-negative integer", "since"));
    }
  }
  // Without engine_id the reader compares the answer's engine_id itself.
  std::string engine_id = log->engine_id();
  if (auto v = query_value(query, "engine_id")) {
    engine_id = std::string(*v);
  }
  engine::KvEventsPage page = log->read_since(engine_id, since);
  json events = json::array();
  for (const engine::KvEvent& e : page.events) {
    events.push_back(
        {{"seq", e.seq}, {"type", engine::kv_event_type_name(e.type)}, {"hashes", e.hashes}});
  }
  json out = {{"engine_id", page.engine_id},
              {"block_size", page.block_size},
              {"seq", page.seq},
              {"reset", page.reset},
              {"events", std::move(events)}};
  return {200, dump_json(out)};
}

}  // namespace crescent::server
