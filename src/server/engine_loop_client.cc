#include "server/engine_loop_client.h"

#include <algorithm>
#include <optional>
#include <span>

namespace crescent::server {

Result<std::unique_ptr<EngineLoopClient>> EngineLoopClient::create(
    engine::LoadedEngine* loaded, engine::KvConnector* kv_connector) {
  engine::EngineOptions options = loaded->engine_options;
  options.kv_connector = kv_connector;
  RETURN_IF_ERROR(engine::Engine::validate_options(options, *loaded->runner));
  auto eng = std::make_unique<engine::Engine>(std::move(options), loaded->runner.get());
  auto loop = std::make_unique<engine::EngineLoop>(std::move(eng));
  return std::unique_ptr<EngineLoopClient>(
      new EngineLoopClient(loaded, std::move(loop), kv_connector));
}

EngineLoopClient::EngineLoopClient(engine::LoadedEngine* loaded,
                                   std::unique_ptr<engine::EngineLoop> loop,
                                   engine::KvConnector* kv_connector)
    : loaded_(loaded),
      kv_connector_(kv_connector),
      loop_(std::move(loop)),
      max_model_len_(loaded->engine_options.max_model_len > 0
                         ? loaded->engine_options.max_model_len
                         : loaded->model->config().max_position_embeddings),
      vocab_size_(loaded->model->config().vocab_size) {}

EngineLoopClient::~EngineLoopClient() {
  shutdown();
}

void EngineLoopClient::release_refused_transfer(const engine::KvTransferParams& params) {
  if (kv_connector_ != nullptr) {
    kv_connector_->release_unpulled(params);
  }
}

void EngineLoopClient::shutdown() {
  loop_->shutdown();
}

Result<std::vector<int32_t>> EngineLoopClient::tokenize(std::string_view text,
                                                        bool add_special_tokens) const {
  return loaded_->tokenizer->encode(text, add_special_tokens);
}

std::string EngineLoopClient::token_text(int32_t token_id) const {
  return loaded_->tokenizer->decode(std::span<const int32_t>(&token_id, 1), false);
}

std::string EngineLoopClient::detokenize(std::span<const int32_t> ids) const {
  return loaded_->tokenizer->decode(ids, false);
}

Result<std::string> EngineLoopClient::render_chat(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const {
  std::optional<model::ChatTemplate> request_template;
  if (options.chat_template) {
    // The model's special tokens stay: a request's template replaces only the text.
    model::TokenizerConfig config =
        loaded_->chat_template ? loaded_->chat_template->config() : model::TokenizerConfig{};
    ASSIGN_OR_RETURN(request_template,
                     model::ChatTemplate::from_template(*options.chat_template, std::move(config)));
  } else if (!loaded_->chat_template) {
    return unimplemented("the model has no chat template");
  }
  const model::ChatTemplate& tmpl = request_template ? *request_template : *loaded_->chat_template;
  // OpenAI-shaped messages as transformers passes them: a string content, or, with images, a
  // list of {"type": "image"} and {"type": "text", "text": ...} parts.
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json message = {{"role", m.role}};
    const bool has_images =
        std::any_of(m.parts.begin(), m.parts.end(), [](const auto& p) { return p.is_image; });
    if (!has_images) {
      message["content"] = m.content;
    } else {
      nlohmann::ordered_json parts = nlohmann::ordered_json::array();
      for (const ChatContentPart& part : m.parts) {
        if (part.is_image) {
          parts.push_back({{"type", "image"}});
        } else {
          parts.push_back({{"type", "text"}, {"text", part.text}});
        }
      }
      message["content"] = std::move(parts);
    }
    for (const auto& [key, value] : m.fields.items()) {
      message[key] = value;
    }
    list.push_back(std::move(message));
  }
  model::ChatRenderOptions render_options;
  render_options.add_generation_prompt = options.add_generation_prompt;
  render_options.continue_final_message = options.continue_final_message;
  render_options.template_kwargs = options.template_kwargs;
  render_options.tools = options.tools;
  return tmpl.render_json(list, render_options);
}

Status EngineLoopClient::submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                                engine::SamplingParams sampling, const SubmitOptions& options,
                                OutputCallback on_output) {
  engine::EngineRequest request;
  request.kv_transfer_params = options.kv_transfer;
  request.mm_items = options.mm_items;
  request.request_id = std::move(request_id);
  request.prompt_token_ids = std::move(prompt_token_ids);
  request.sampling = std::move(sampling);
  return loop_->submit(std::move(request),
                       [cb = std::move(on_output)](const engine::RequestOutput& in) {
                         GenerationOutput out;
                         out.new_token_ids = in.new_token_ids;
                         out.new_text = in.new_text;
                         out.logprobs.reserve(in.logprobs.size());
                         for (const auto& lp : in.logprobs) {
                           TokenLogprobs t;
                           t.sampled = {lp.sampled.token_id, lp.sampled.logprob};
                           for (const auto& alt : lp.top) {
                             t.top.push_back({alt.token_id, alt.logprob});
                           }
                           out.logprobs.push_back(std::move(t));
                         }
                         out.finished = in.finished;
                         if (in.finished) {
                           out.finish_reason = engine::finish_reason_name(in.finish_reason);
                         }
                         out.stop_reason = in.stop_reason;
                         out.stop_token_id = in.stop_token_id;
                         out.error_message = in.error_message;
                         out.error_code = in.error_code;
                         out.num_prompt_tokens = in.num_prompt_tokens;
                         out.num_output_tokens = in.num_output_tokens;
                         out.num_cached_tokens = in.num_cached_tokens;
                         cb(out);
                       });
}

void EngineLoopClient::abort(const std::string& request_id) {
  loop_->abort(request_id);
}

EngineMetrics EngineLoopClient::metrics() const {
  engine::EngineStats s = loop_->stats();
  EngineMetrics m;
  m.num_running = s.num_running;
  m.num_waiting = s.num_waiting;
  m.num_blocks_total = s.num_blocks_total;
  m.num_blocks_used = s.num_blocks_used;
  m.prefix_cache_queries_tokens = s.prefix_cache_queries_tokens;
  m.prefix_cache_hits_tokens = s.prefix_cache_hits_tokens;
  m.num_prompt_tokens_total = s.num_prompt_tokens_total;
  m.num_generation_tokens_total = s.num_generation_tokens_total;
  m.num_preemptions_total = s.num_preemptions_total;
  m.num_waiting_for_remote_kv = s.num_waiting_for_remote_kv;
  m.num_blocks_held_for_remote = s.num_blocks_held_for_remote;
  if (!loaded_->is_multimodal()) {
    return m;
  }
  m.num_images_encoded_total = s.num_images_encoded_total;
  m.num_encoder_tokens_total = s.num_encoder_tokens_total;
  m.encoder_seconds_total = s.encoder_seconds_total;
  m.encoder_cache_hits_total = s.encoder_cache.num_hits;
  m.encoder_cache_misses_total = s.encoder_cache.num_misses;
  m.encoder_cache_evictions_total = s.encoder_cache.num_evictions;
  m.encoder_cache_tokens_used = s.encoder_cache.num_tokens_used;
  m.encoder_cache_tokens_total = s.encoder_cache.capacity_tokens;
  return m;
}

}  // namespace crescent::server
