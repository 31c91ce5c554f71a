#include "server/data_parallel_engine_client.h"

#include "core/check.h"

namespace crescent::server {

DataParallelEngineClient::DataParallelEngineClient(std::vector<EngineClient*> ranks)
    : ranks_(std::move(ranks)), num_in_flight_(ranks_.size(), 0) {
  CRESCENT_CHECK(!ranks_.empty());
  for (EngineClient* rank : ranks_) {
    CRESCENT_CHECK(rank->max_model_len() == ranks_[0]->max_model_len());
    CRESCENT_CHECK(rank->vocab_size() == ranks_[0]->vocab_size());
  }
}

Result<std::vector<int32_t>> DataParallelEngineClient::tokenize(std::string_view text,
                                                                bool add_special_tokens) const {
  return ranks_[0]->tokenize(text, add_special_tokens);
}

std::string DataParallelEngineClient::token_text(int32_t token_id) const {
  return ranks_[0]->token_text(token_id);
}

Result<std::string> DataParallelEngineClient::render_chat(const std::vector<ChatMessage>& messages,
                                                          const ChatRenderOptions& options) const {
  return ranks_[0]->render_chat(messages, options);
}

int DataParallelEngineClient::pick_rank_locked() const {
  int best = 0;
  for (int r = 1; r < num_ranks(); ++r) {
    if (num_in_flight_[r] < num_in_flight_[best]) {
      best = r;
    }
  }
  return best;
}

Status DataParallelEngineClient::submit(std::string request_id,
                                        std::vector<int32_t> prompt_token_ids,
                                        engine::SamplingParams sampling,
                                        const SubmitOptions& options, OutputCallback on_output) {
  int rank = options.data_parallel_rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank >= num_ranks()) {
      return invalid_argument("X-data-parallel-rank " + std::to_string(rank) +
                              " is out of range: this server runs " + std::to_string(num_ranks()) +
                              " data-parallel rank(s)");
    }
    if (rank < 0) {
      rank = pick_rank_locked();
    }
    if (!rank_of_request_.emplace(request_id, rank).second) {
      return already_exists("request id " + request_id + " is in use");
    }
    ++num_in_flight_[rank];
  }
  auto forget = [this, request_id, rank] {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank_of_request_.erase(request_id) != 0) {
      --num_in_flight_[rank];
    }
  };
  Status s =
      ranks_[rank]->submit(request_id, std::move(prompt_token_ids), std::move(sampling), options,
                           [forget, cb = std::move(on_output)](const GenerationOutput& out) {
                             if (out.finished) {
                               forget();
                             }
                             cb(out);
                           });
  if (!s.is_ok()) {
    forget();
  }
  return s;
}

void DataParallelEngineClient::release_refused_transfer(const engine::KvTransferParams& params) {
  ranks_[0]->release_refused_transfer(params);
}

void DataParallelEngineClient::abort(const std::string& request_id) {
  int rank = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rank_of_request_.find(request_id);
    if (it == rank_of_request_.end()) {
      return;
    }
    rank = it->second;
  }
  ranks_[rank]->abort(request_id);
}

EngineMetrics DataParallelEngineClient::metrics() const {
  EngineMetrics sum;
  for (EngineClient* rank : ranks_) {
    EngineMetrics m = rank->metrics();
    sum.num_running += m.num_running;
    sum.num_waiting += m.num_waiting;
    sum.num_blocks_total += m.num_blocks_total;
    sum.num_blocks_used += m.num_blocks_used;
    sum.prefix_cache_queries_tokens += m.prefix_cache_queries_tokens;
    sum.prefix_cache_hits_tokens += m.prefix_cache_hits_tokens;
    sum.num_prompt_tokens_total += m.num_prompt_tokens_total;
    sum.num_generation_tokens_total += m.num_generation_tokens_total;
    sum.num_preemptions_total += m.num_preemptions_total;
    sum.num_waiting_for_remote_kv += m.num_waiting_for_remote_kv;
    sum.num_blocks_held_for_remote += m.num_blocks_held_for_remote;
    sum.num_images_encoded_total += m.num_images_encoded_total;
    sum.num_encoder_tokens_total += m.num_encoder_tokens_total;
    sum.encoder_seconds_total += m.encoder_seconds_total;
    sum.encoder_cache_hits_total += m.encoder_cache_hits_total;
    sum.encoder_cache_misses_total += m.encoder_cache_misses_total;
    sum.encoder_cache_evictions_total += m.encoder_cache_evictions_total;
    sum.encoder_cache_tokens_used += m.encoder_cache_tokens_used;
    sum.encoder_cache_tokens_total += m.encoder_cache_tokens_total;
  }
  return sum;
}

}  // namespace crescent::server
