#pragma once
// EngineLoopClient: the EngineClient over a real engine — an engine::EngineLoop (its own
// thread) running an Engine built from a LoadedEngine, whose tokenizer and chat template
// serve tokenize() and render_chat(). The LoadedEngine must outlive this object.
// Thread-safe.

#include <memory>

#include "engine/engine_loop.h"
#include "engine/loader.h"
#include "server/engine_client.h"

namespace crescent::server {

class EngineLoopClient : public EngineClient {
 public:
  // InvalidArgument if the loaded engine's options do not fit its runner. kv_connector (may
  // be null: requests with kv_transfer_params are refused) must outlive this object.
  static Result<std::unique_ptr<EngineLoopClient>> create(
      engine::LoadedEngine* loaded, engine::KvConnector* kv_connector = nullptr);
  ~EngineLoopClient() override;  // shutdown()

  // Aborts whatever runs (each request gets its "abort" output) and stops the engine thread.
  void shutdown();

  int max_model_len() const override { return max_model_len_; }
  int vocab_size() const override { return vocab_size_; }
  Result<std::vector<int32_t>> tokenize(std::string_view text,
                                        bool add_special_tokens) const override;
  std::string token_text(int32_t token_id) const override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  std::shared_ptr<const engine::KvEventLog> kv_event_log() const override {
    return loop_->kv_event_log();
  }
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                  const ChatRenderOptions& options) const override;
  Status submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                engine::SamplingParams sampling, const SubmitOptions& options,
                OutputCallback on_output) override;
  void abort(const std::string& request_id) override;
  void release_refused_transfer(const engine::KvTransferParams& params) override;
  EngineMetrics metrics() const override;

 private:
  EngineLoopClient(engine::LoadedEngine* loaded, std::unique_ptr<engine::EngineLoop> loop,
                   engine::KvConnector* kv_connector);

  engine::LoadedEngine* loaded_;
  engine::KvConnector* kv_connector_;  // may be null
  std::unique_ptr<engine::EngineLoop> loop_;
  int max_model_len_;
  int vocab_size_;
};

}  // namespace crescent::server
