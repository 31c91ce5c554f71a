#pragma once
// EncodeHandler: the generation endpoint of `crescent serve --role encode` (EPD, DESIGN.md
// §2b). The server prepares a chat request's images as any vision-language server does; this
// encodes each one straight into the EC producer's tensor pool and answers a chat.completion
// without text whose ec_transfer_params name the pooled tensors, one item per image in order.
// Runs on the server's media threads, never on an I/O thread; one image is encoded at a time
// (the tower spreads each encode over the compute pool). Thread-safe.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/encoder_runner.h"
#include "server/ec_link.h"
#include "server/multimodal_processor.h"
#include "server/openai_protocol.h"

namespace crescent::server {

class EncodeHandler {
 public:
  // encoder and publisher must outlive the handler.
  EncodeHandler(engine::EncoderRunner* encoder, EcPublisher* publisher)
      : encoder_(encoder), publisher_(publisher) {}

  struct Reply {
    int http_status = 200;
    nlohmann::json body;  // the chat.completion, or an OpenAI error object
  };
  // Encodes and publishes `images`; on failure gives up what this request already published.
  // A full pool answers 503, an encoder failure 500.
  Reply encode(const std::vector<PreparedImage>& images, const std::string& response_id,
               const std::string& model_name, int64_t created);

  // The encoder's Prometheus families (crescent_encoder_*; an encoder has no engine).
  void render_metrics(const std::string& model_name, std::string* out) const;

 private:
  engine::EncoderRunner* encoder_;
  EcPublisher* publisher_;
  std::mutex encoder_mu_;  // the runner is not thread-safe
  std::atomic<int64_t> num_images_encoded_total_{0};
  std::atomic<int64_t> num_encoder_tokens_total_{0};
  std::atomic<int64_t> encoder_ns_total_{0};
  std::atomic<int64_t> num_pool_hits_total_{0};  // mm_hash already in the pool: not encoded
  std::atomic<int64_t> num_pool_full_total_{0};  // images refused for a full pool
  std::atomic<int64_t> num_requests_total_{0};
};

}  // namespace crescent::server
