#pragma once
// The OpenAI wire format for /v1/completions and /v1/chat/completions: parsing and validating
// a request body into a GenerationRequest, and building responses, stream chunks and errors.
// Pure functions over nlohmann::json; no I/O, no engine.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv_connector.h"
#include "engine/sampling_params.h"
#include "server/engine_client.h"

namespace crescent::server {

// An error as OpenAI shapes it, with its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "not_found_error", "internal_server_error"
  std::string param;                           // "" -> null
};
// {"error": {"message", "type", "param", "code"}} with `code` the HTTP status as an integer,
// as vLLM writes it.
nlohmann::json error_json(const ApiError& error);
ApiError bad_request(std::string message, std::string param = "");
// Any other status: 401, 404, 5xx.
ApiError api_error(int http_status, std::string message, std::string type);

enum class Endpoint { kCompletions, kChat };

// An image of a chat request as sent: `url` is the image_url part's url (data:, file:// or
// http(s)://, fetched by fetch_image_bytes in image_inputs.h), `message_index` the message
// that holds it.
struct ImageRef {
  std::string url;
  int message_index = 0;
};

// What a chat request asks of its tools, with vLLM's rules: tools given without tool_choice
// mean "auto".
enum class ToolChoice {
  kNone,      // no tools, an empty list, or tool_choice "none": the tools only reach the template
  kAuto,      // the model may call a tool: its output is parsed for calls (--tool-call-parser)
  kRequired,  // "required": guided decoding makes the output a JSON array of calls
  kNamed,     // {"type": "function", ...}: the output is the named function's arguments
};

inline constexpr int kMaxChoices = 128;  // OpenAI's bound on n

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when absent
  // Exactly one of these is set by the parser.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_token_ids;
  std::vector<ChatMessage> messages;  // kChat
  // kChat: the image_url parts of all messages in order, one per image part of `messages`.
  std::vector<ImageRef> images;
  // kChat: add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs
  // and tools, as the request gives them.
  ChatRenderOptions chat_render;
  // kChat. Whether the server can parse calls (kAuto) is checked by the server, which knows
  // its --tool-call-parser.
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed: the function
  // kChat, OpenAI's parallel_tool_calls: false keeps only the first call parsed.
  bool parallel_tool_calls = true;
  engine::SamplingParams sampling;
  // OpenAI's n: independent choices of the same prompt (the engine's prefix cache shares the
  // prompt's KV blocks between them). 1..kMaxChoices.
  int n = 1;
  // vLLM's best_of: best_of choices are generated and the n with the highest cumulative
  // logprob (the sum of the sampled tokens' logprobs, as `logprobs` reports them) are
  // returned. n..kMaxChoices; not streamed when above n.
  int best_of = 1;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries the running usage.
  bool continuous_usage_stats = false;
  // Chat: logprobs is a bool and top_logprobs the count; completions: logprobs is the count.
  bool want_logprobs = false;
  std::optional<nlohmann::json> kv_transfer_params;  // as sent: echoed in the response
  engine::KvTransferParams kv_transfer;              // the fields crescent acts on
  // EPD: the encoder outputs of this request's images, as an encoder worker answered them
  // ({"items": [...]}); an object when present, its items parsed by the EC connector.
  std::optional<nlohmann::json> ec_transfer_params;
};

// The kv_transfer_params of a body that asks to pull its KV from a prefill engine
// (do_remote_prefill), when they parse, whatever else is wrong with the body: what a decode
// server tells the prefill engine to free when it refuses the request.
std::optional<engine::KvTransferParams> remote_prefill_of(const std::string& body);

// Parses and checks a body; everything that does not need the engine (types, ranges,
// n == 1, non-empty messages, content part types, the shape of tool_calls) is checked here;
// the chat template's own refusals (an unknown role, a syntax error) come when it renders. Image
// URLs are not fetched or checked beyond being non-empty strings; logit_bias ids and min_tokens
// against a defaulted max_tokens are checked once the engine is known. Fields crescent knows but
// does not implement (best_of, response_format, tool_choice "required", guided decoding, ...) are
// a 400 naming them unless they ask for nothing; fields it does not know are ignored.
std::optional<ApiError> parse_generation_request(const std::string& body, Endpoint endpoint,
                                                 GenerationRequest* out);

// Text of a response body; invalid UTF-8 in generated text is replaced, never thrown.
std::string dump_json(const nlohmann::json& j);

}  // namespace crescent::server
