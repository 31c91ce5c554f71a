// The Engine's vision-language hooks: the encoder budget of a step, the encoder cache, and the
// per-chunk inputs (image embeddings, M-RoPE positions) handed to the runner.
#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"
#include "core/logging.h"
#include "engine/engine.h"

namespace crescent::engine {

Status Engine::validate_multimodal(const EngineRequest& request) const {
  if (request.mm_items.empty()) {
    return Status::ok();
  }
  const int num_prompt = static_cast<int>(request.prompt_token_ids.size());
  const bool is_remote_prefill = request.kv_transfer_params.do_remote_prefill;
  RETURN_IF_ERROR(validate_multimodal_items(request.mm_items, num_prompt,
                                            /*require_inputs=*/!is_remote_prefill));
  for (size_t i = 0; i < request.mm_items.size(); ++i) {
    const MultiModalItem& item = request.mm_items[i];
    if (!item.embeddings && options_.encoder_runner == nullptr) {
      // A decode engine of a VL model has no tower: the prompt's KV (images included) comes
      // from the prefill engine, and only the last prompt token, text, is computed here.
      if (is_remote_prefill) {
        continue;
      }
      return invalid_argument("this model does not take images (it has no vision encoder)");
    }
    if (item.embeddings) {
      const int hidden =
          options_.encoder_runner != nullptr ? options_.encoder_runner->hidden_size() : 0;
      if (hidden > 0 &&
          static_cast<int64_t>(item.embeddings->size()) != int64_t{item.num_tokens} * hidden) {
        return invalid_argument("image " + std::to_string(i) + ": embeddings hold " +
                                std::to_string(item.embeddings->size()) + " floats, not " +
                                std::to_string(item.num_tokens) + " rows of " +
                                std::to_string(hidden));
      }
    } else if (item.num_tokens > encoder_cache_.capacity_tokens()) {
      std::ostringstream os;
      os << "image " << i << " needs " << item.num_tokens
         << " embedding rows, more than the encoder cache holds ("
         << encoder_cache_.capacity_tokens()
         << "; raise --encoder-cache-size or send a smaller image)";
      return invalid_argument(os.str());
    }
  }
  return Status::ok();
}

void Engine::init_multimodal(Request& r, std::vector<MultiModalItem> items) {
  if (items.empty()) {
    return;
  }
  r.mm_items = std::move(items);
  r.mm_embeddings.assign(r.mm_items.size(), nullptr);
  for (const MultiModalItem& item : r.mm_items) {
    r.seq.mm_placeholders.push_back({item.offset, item.num_tokens, mm_hash_key(item.mm_hash)});
  }
  r.mrope_positions = mrope_positions(r.seq.num_prompt_tokens, r.mm_items, &r.mrope_delta);
}

Engine::Request* Engine::find_request(const Sequence* seq) {
  auto it = requests_.find(seq->request_id);
  CRESCENT_CHECK(it != requests_.end()) << "scheduled request " << seq->request_id << " is unknown";
  return it->second.get();
}

void Engine::prepare_multimodal(ScheduleResult& schedule) {
  for (Sequence* seq : schedule.preempted) {
    if (!seq->mm_placeholders.empty()) {
      release_multimodal(*find_request(seq), /*all=*/true);
    }
  }
  int budget = options_.max_num_encoder_tokens_per_step > 0
                   ? options_.max_num_encoder_tokens_per_step
                   : options_.max_num_batched_tokens;
  bool encoded_any = false;
  std::vector<ScheduledSeq> kept;
  kept.reserve(schedule.scheduled.size());
  for (ScheduledSeq& s : schedule.scheduled) {
    Sequence& seq = *s.seq;
    if (seq.mm_placeholders.empty()) {
      kept.push_back(s);
      continue;
    }
    Request& r = *find_request(&seq);
    const int start = seq.num_computed_tokens;
    int end = start + s.num_new_tokens;
    Status failure;
    for (size_t k = 0; k < r.mm_items.size() && failure.is_ok(); ++k) {
      const MultiModalItem& item = r.mm_items[k];
      if (item.offset >= end || item.end() <= start || r.mm_embeddings[k]) {
        continue;
      }
      if (item.embeddings) {
        r.mm_embeddings[k] = item.embeddings;
        continue;
      }
      if (encoder_cache_.contains(item.mm_hash)) {
        r.mm_embeddings[k] = encoder_cache_.acquire(item.mm_hash);
        continue;
      }
      if ((encoded_any && item.num_tokens > budget) ||
          !encoder_cache_.can_insert(item.num_tokens)) {
        end = item.offset;  // the rest of the prompt waits for a later step
        break;
      }
      if (options_.encoder_runner == nullptr || item.input == nullptr) {
        // Only a request whose KV was to come from a prefill engine gets here without either
        // (validate_multimodal): its remote KV did not cover this image.
        failure = failed_precondition(
            "image " + std::to_string(k) +
            " would have to be encoded here, but this engine has no vision encoder (a decode "
            "engine's images must come with the prompt's KV from the prefill engine)");
        break;
      }
      encoder_cache_.acquire(item.mm_hash);  // counts the miss
      const int64_t t0 = now_ns();
      Result<std::vector<float>> out = options_.encoder_runner->encode(*item.input);
      encoder_seconds_total_ += static_cast<double>(now_ns() - t0) * 1e-9;
      if (!out.is_ok()) {
        failure = out.status();
        break;
      }
      if (static_cast<int64_t>(out->size()) !=
          int64_t{item.num_tokens} * options_.encoder_runner->hidden_size()) {
        failure = internal_error("the encoder returned " + std::to_string(out->size()) +
                                 " floats for an image of " + std::to_string(item.num_tokens) +
                                 " tokens");
        break;
      }
      ++num_images_encoded_total_;
      num_encoder_tokens_total_ += item.num_tokens;
      budget -= item.num_tokens;
      encoded_any = true;
      r.mm_embeddings[k] = encoder_cache_.insert(
          item.mm_hash, std::make_shared<const std::vector<float>>(std::move(*out)),
          item.num_tokens);
    }
    if (!failure.is_ok()) {
      CRESCENT_LOG(kWarn) << "request " << seq.request_id
                          << ": image encoding failed: " << failure.to_string();
      r.pending.error_message = "image encoding failed: " + failure.to_string();
      r.pending.error_code = failure.code() == StatusCode::kInvalidArgument
                                 ? StatusCode::kInvalidArgument
                                 : StatusCode::kInternal;
      const std::string id = seq.request_id;
      finish(r, FinishReason::kError);
      aborted_outputs_.push_back(take_output(r));
      requests_.erase(id);
      continue;
    }
    if (end < start + s.num_new_tokens) {
      schedule.num_batched_tokens -= start + s.num_new_tokens - end;
      s.num_new_tokens = end - start;
      s.needs_logits = false;
    }
    if (s.num_new_tokens > 0) {
      kept.push_back(s);
    }
  }
  schedule.scheduled = std::move(kept);
}

void Engine::add_multimodal_inputs(const Request& r, int start, int num_new, RunnerSeq& rs) {
  std::vector<int32_t>& pos = mm_positions_scratch_.emplace_back();
  pos.resize(static_cast<size_t>(num_new) * 3);
  const int num_prompt = r.seq.num_prompt_tokens;
  for (int i = 0; i < num_new; ++i) {
    const int index = start + i;
    for (int k = 0; k < 3; ++k) {
      pos[static_cast<size_t>(i) * 3 + k] =
          index < num_prompt ? r.mrope_positions[static_cast<size_t>(index) * 3 + k]
                             : index + r.mrope_delta;
    }
  }
  rs.positions3 = pos;
  std::vector<InputEmbeddings>& rows = mm_embeddings_scratch_.emplace_back();
  const int end = start + num_new;
  for (size_t k = 0; k < r.mm_items.size(); ++k) {
    const MultiModalItem& item = r.mm_items[k];
    const int lo = std::max(start, item.offset);
    const int hi = std::min(end, item.end());
    if (lo >= hi) {
      continue;
    }
    CRESCENT_CHECK(r.mm_embeddings[k] != nullptr)
        << r.seq.request_id << ": image " << k << " scheduled without its embeddings";
    const int64_t hidden = static_cast<int64_t>(r.mm_embeddings[k]->size()) / item.num_tokens;
    rows.push_back({lo - start, hi - lo, r.mm_embeddings[k]->data() + (lo - item.offset) * hidden});
  }
  rs.embeddings = rows;
}

void Engine::release_multimodal(Request& r, bool all) {
  for (size_t k = 0; k < r.mm_items.size(); ++k) {
    if (!r.mm_embeddings[k]) {
      continue;
    }
    const MultiModalItem& item = r.mm_items[k];
    if (!all && item.end() > r.seq.num_computed_tokens) {
      continue;  // its tokens are still to be computed
    }
    if (!item.embeddings) {
      encoder_cache_.release(item.mm_hash);
    }
    r.mm_embeddings[k] = nullptr;
  }
}

}  // namespace crescent::engine
