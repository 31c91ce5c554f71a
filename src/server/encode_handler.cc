#include "server/encode_handler.h"

#include <cstring>

#include "core/clock.h"
#include "core/logging.h"
#include "core/prometheus.h"

namespace crescent::server {

using json = nlohmann::json;

EncodeHandler::Reply EncodeHandler::encode(const std::vector<PreparedImage>& images,
                                           const std::string& response_id,
                                           const std::string& model_name, int64_t created) {
  num_requests_total_.fetch_add(1);
  const int64_t hidden = encoder_->hidden_size();
  std::vector<EcItem> items;
  items.reserve(images.size());
  int64_t num_image_tokens = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const PreparedImage& image = images[i];
    const int64_t num_tokens = image.num_tokens();
    auto write = [&](float* dst) -> Status {
      std::lock_guard<std::mutex> lock(encoder_mu_);
      const int64_t t0 = now_ns();
      ASSIGN_OR_RETURN(std::vector<float> out, encoder_->encode(*image.input));
      encoder_ns_total_.fetch_add(now_ns() - t0);
      if (static_cast<int64_t>(out.size()) != num_tokens * hidden) {
        return internal_error("the encoder returned " + std::to_string(out.size()) +
                              " floats for an image of " + std::to_string(num_tokens) +
                              " tokens of " + std::to_string(hidden));
      }
      std::memcpy(dst, out.data(), out.size() * sizeof(float));
      num_images_encoded_total_.fetch_add(1);
      num_encoder_tokens_total_.fetch_add(num_tokens);
      return Status::ok();
    };
    bool was_cached = false;
    Result<EcItem> item =
        publisher_->publish(image.mm_hash, num_tokens, hidden, write, &was_cached);
    if (!item.is_ok()) {
      publisher_->release(items);
      const std::string what = "image " + std::to_string(i + 1) + " of " +
                               std::to_string(images.size()) + ": " + item.status().message();
      if (item.status().code() == StatusCode::kResourceExhausted) {
        num_pool_full_total_.fetch_add(1);
        return {503, error_json(api_error(
                         503,
                         "the encoder's tensor pool is full (every tensor in it is reserved for "
                         "a consumer that has not pulled it yet); retry later or raise "
                         "--ec-pool-size: " +
                             what,
                         "service_unavailable"))};
      }
      CRESCENT_LOG(kWarn) << "encode request " << response_id << ": " << what;
      return {500, error_json(
                       api_error(500, "image encoding failed: " + what, "internal_server_error"))};
    }
    if (was_cached) {
      num_pool_hits_total_.fetch_add(1);
    }
    num_image_tokens += num_tokens;
    items.push_back(std::move(item).value());
    // The image's grid in LLM tokens, beside the connector's fields: a decode server takes
    // mm_hash and grid from here instead of decoding the image (its M-RoPE positions).
    items.back().wire["grid"] = {image.llm_grid_t, image.llm_grid_h, image.llm_grid_w};
  }
  json wire_items = json::array();
  for (const EcItem& item : items) {
    wire_items.push_back(item.wire);
  }
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", ""}}},
                 {"logprobs", nullptr},
                 {"finish_reason", "length"},
                 {"stop_reason", nullptr}};
  json body = {{"id", response_id},
               {"object", "chat.completion"},
               {"created", created},
               {"model", model_name},
               {"choices", json::array({choice})},
               {"usage",
                {{"prompt_tokens", num_image_tokens},
                 {"completion_tokens", 0},
                 {"total_tokens", num_image_tokens}}},
               {"ec_transfer_params", {{"items", std::move(wire_items)}}}};
  return {200, std::move(body)};
}

void EncodeHandler::render_metrics(const std::string& model_name, std::string* out) const {
  const std::string label = "{model_name=\"" + model_name + "\"}";
  prometheus::SampleWriter w(out, "", label);
  auto counter = [&](const std::string& name, const char* help, double v) {
    w.counter(name, help, v);
  };
  counter("crescent_encoder_images_total", "Images run through the vision encoder.",
          static_cast<double>(num_images_encoded_total_.load()));
  counter("crescent_encoder_tokens_total", "Embedding rows the vision encoder produced.",
          static_cast<double>(num_encoder_tokens_total_.load()));
  counter("crescent_encoder_seconds_total", "Time spent in the vision encoder.",
          static_cast<double>(encoder_ns_total_.load()) * 1e-9);
  counter("crescent_encoder_requests_total", "Encode requests answered or refused.",
          static_cast<double>(num_requests_total_.load()));
  counter("crescent_encoder_pool_hits_total",
          "Images whose embeddings the tensor pool already held (not encoded again).",
          static_cast<double>(num_pool_hits_total_.load()));
  counter("crescent_encoder_pool_full_total", "Images refused because the tensor pool was full.",
          static_cast<double>(num_pool_full_total_.load()));
}

}  // namespace crescent::server
