#pragma once
// DataParallelEngineClient: one EngineClient over several engine ranks of one deployment
// (`crescent serve --data-parallel-size N`). A request goes to the rank its
// X-data-parallel-rank header names (the proxy picks it, since each rank has its own KV
// connector and engine id), or, without one, to the rank with the fewest requests in flight.
// Tokenizing and chat rendering use rank 0 (all ranks load the same model). Metrics are summed.
// The ranks must outlive this object. Thread-safe.

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/engine_client.h"

namespace crescent::server {

class DataParallelEngineClient : public EngineClient {
 public:
  // ranks: at least one; every rank must report the same max_model_len and vocab_size.
  explicit DataParallelEngineClient(std::vector<EngineClient*> ranks);

  int num_ranks() const { return static_cast<int>(ranks_.size()); }

  int max_model_len() const override { return ranks_[0]->max_model_len(); }
  int vocab_size() const override { return ranks_[0]->vocab_size(); }
  Result<std::vector<int32_t>> tokenize(std::string_view text,
                                        bool add_special_tokens) const override;
  std::string token_text(int32_t token_id) const override;
  std::string detokenize(std::span<const int32_t> ids) const override {
    return ranks_[0]->detokenize(ids);
  }
  // With one rank, its log; with several, none (each rank has its own cache).
  std::shared_ptr<const engine::KvEventLog> kv_event_log() const override {
    return ranks_.size() == 1 ? ranks_[0]->kv_event_log() : nullptr;
  }
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                  const ChatRenderOptions& options) const override;
  // InvalidArgument when options.data_parallel_rank is out of range.
  Status submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                engine::SamplingParams sampling, const SubmitOptions& options,
                OutputCallback on_output) override;
  void abort(const std::string& request_id) override;
  // Through rank 0's connector: any rank can tell the prefill engine.
  void release_refused_transfer(const engine::KvTransferParams& params) override;
  EngineMetrics metrics() const override;

 private:
  int pick_rank_locked() const;

  std::vector<EngineClient*> ranks_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, int> rank_of_request_;  // live requests
  std::vector<int> num_in_flight_;                        // per rank
};

}  // namespace crescent::server
