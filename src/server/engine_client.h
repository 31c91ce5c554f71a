#pragma once
// EngineClient: everything the OpenAI server needs from one engine, behind an interface so
// the server is tested without a model (FakeEngineClient) and the engine never sees HTTP
// (EngineLoopClient adapts the real EngineLoop + LoadedEngine).
//
// Implementations are thread-safe. submit() never blocks on generation: on_output is called
// later from the engine's thread, once per batch of new tokens, and a last time with
// finished = true (also after abort()).

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/kv_connector.h"
#include "engine/kv_events.h"
#include "engine/multimodal.h"
#include "engine/sampling_params.h"

namespace crescent::server {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;  // most likely first
};

struct GenerationOutput {
  std::vector<int32_t> new_token_ids;
  std::string new_text;
  std::vector<TokenLogprobs> logprobs;  // one per new token when asked for
  bool finished = false;
  std::string finish_reason;  // when finished: "stop", "length", "abort" or "error"
  std::string stop_reason;    // the stop string that matched, if any
  int32_t stop_token_id = -1;
  std::string error_message;  // "error": why
  // "error": its kind. A remote KV fetch's failure keeps the code its peer or deadline gave
  // it, so that the server can tell an upstream failure from its own.
  StatusCode error_code = StatusCode::kOk;
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;  // so far
  int num_cached_tokens = 0;
};

struct EngineMetrics {
  int num_running = 0;
  int num_waiting = 0;
  int num_blocks_total = 0;
  int num_blocks_used = 0;
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hits_tokens = 0;
  int64_t num_prompt_tokens_total = 0;
  int64_t num_generation_tokens_total = 0;
  int64_t num_preemptions_total = 0;
  int num_waiting_for_remote_kv = 0;   // decode side: parked until a prefill engine sends KV
  int num_blocks_held_for_remote = 0;  // blocks kept for a peer (prefill side, or in a cancel)
  // Vision-language models: the image encoder and its cache.
  int64_t num_images_encoded_total = 0;
  int64_t num_encoder_tokens_total = 0;
  double encoder_seconds_total = 0;
  int64_t encoder_cache_hits_total = 0;    // images whose embeddings were reused
  int64_t encoder_cache_misses_total = 0;  // images that had to be encoded
  int64_t encoder_cache_evictions_total = 0;
  int64_t encoder_cache_tokens_used = 0;
  int64_t encoder_cache_tokens_total = 0;  // capacity
};

// Per-request routing and disaggregation settings beside the prompt and sampling parameters.
struct SubmitOptions {
  engine::KvTransferParams kv_transfer;          // from the body's kv_transfer_params
  int data_parallel_rank = -1;                   // X-data-parallel-rank; -1: the client picks
  std::vector<engine::MultiModalItem> mm_items;  // images: placeholder runs in the prompt
};

// One piece of an OpenAI content-parts list: text, or an image (the request's images travel
// separately, in order; see GenerationRequest::images).
struct ChatContentPart {
  bool is_image = false;
  std::string text;  // text parts only
};

struct ChatMessage {
  std::string role;
  // The text of the message; for a parts list, its text parts concatenated.
  std::string content;
  // Empty for a string content; otherwise the content in order, images included.
  // (The "= {}" keeps {role, content} a complete initializer under -Wextra.)
  std::vector<ChatContentPart> parts = {};
  // The message's other OpenAI fields that templates read (tool_calls with their arguments
  // as objects, tool_call_id, name), passed to the template beside role and content.
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
};

// How render_chat renders, from the request (vLLM's fields of the same names).
struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // The output ends right after the final (assistant) message, for the model to continue it.
  bool continue_final_message = false;
  // chat_template_kwargs: extra template variables (e.g. enable_thinking), a JSON object.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // The template's `tools` (null: none).
  nlohmann::ordered_json tools = nullptr;
  // A request's own template text, used instead of the model's for this render.
  std::optional<std::string> chat_template;
};

class EngineClient {
 public:
  using OutputCallback = std::function<void(const GenerationOutput&)>;
  virtual ~EngineClient() = default;

  virtual int max_model_len() const = 0;
  virtual int vocab_size() const = 0;

  virtual Result<std::vector<int32_t>> tokenize(std::string_view text,
                                                bool add_special_tokens) const = 0;
  // The text of one token, as logprobs report it.
  virtual std::string token_text(int32_t token_id) const = 0;
  // The text of ids (POST /detokenize); by default the tokens' texts joined.
  virtual std::string detokenize(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) {
      out += token_text(id);
    }
    return out;
  }
  // The prefix cache's event log (engine/kv_events.h) for GET /v1/kv_events; null when there
  // is none to publish.
  virtual std::shared_ptr<const engine::KvEventLog> kv_event_log() const { return nullptr; }
  // Renders a chat with the model's template (or options.chat_template); Unimplemented if
  // there is none, InvalidArgument for a template that does not parse or refuses the chat.
  virtual Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                          const ChatRenderOptions& options) const = 0;

  // InvalidArgument for a request the engine refuses (bad params, prompt too long, duplicate
  // id); on_output is then never called.
  virtual Status submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                        engine::SamplingParams sampling, const SubmitOptions& options,
                        OutputCallback on_output) = 0;
  // Frees the request's resources at once; its last output (finish_reason "abort") follows.
  // Unknown or finished ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  // A request with kv_transfer_params (do_remote_prefill) that the server refused before
  // submit(): tells its prefill engine, best effort, that the KV will not be pulled, so it
  // frees the blocks at once (engine::KvConnector::release_unpulled). Never blocks.
  virtual void release_refused_transfer(const engine::KvTransferParams& params) {}
  virtual EngineMetrics metrics() const = 0;
};

}  // namespace crescent::server
