// The engine's side of P/D disaggregation: where requests with kv_transfer_params meet the
// KvConnector (kv_connector.h is the contract). Decode side: a parked request's fetch is
// started on admission and resumed or failed by the connector's events; an aborted fetch keeps
// its blocks in fetch_limbo_ until the connector says no peer writes into them any more.
// Prefill side: a finished request's blocks go to held_for_remote_ until the decode engine
// has read them.

#include <algorithm>

#include "core/check.h"
#include "core/logging.h"
#include "engine/engine.h"

namespace crescent::engine {

Status Engine::validate_kv_transfer(const EngineRequest& request) const {
  const KvTransferParams& kv = request.kv_transfer_params;
  if (!kv.is_remote()) {
    return Status::ok();
  }
  if (kv_connector_ == nullptr) {
    return invalid_argument(
        std::string("kv_transfer_params asks for a remote ") +
        (kv.do_remote_prefill ? "prefill" : "decode") +
        ", but this server has no KV connector; start it with --role prefill|decode");
  }
  if (kv.do_remote_prefill && kv.do_remote_decode) {
    return invalid_argument(
        "kv_transfer_params: do_remote_prefill and do_remote_decode cannot both be true");
  }
  return Status::ok();
}

void Engine::handle_connector_events() {
  if (kv_connector_ == nullptr) {
    return;
  }
  for (KvConnectorEvent& event : kv_connector_->take_events()) {
    const std::string& id = event.request_id;
    if (event.kind == KvConnectorEvent::Kind::kBlocksReleased) {
      auto held = held_for_remote_.find(id);
      if (held == held_for_remote_.end()) {
        CRESCENT_LOG(kWarn) << "KV connector released blocks of " << id
                            << ", which holds none; ignored";
        continue;
      }
      block_manager_.free(held->second);
      held_for_remote_.erase(held);
      continue;
    }
    // kRemoteKvReady: an aborted fetch's blocks are safe to reuse now, whatever the status.
    auto limbo = fetch_limbo_.find(id);
    if (limbo != fetch_limbo_.end()) {
      block_manager_.free(limbo->second);
      fetch_limbo_.erase(limbo);
      continue;
    }
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->seq.status != SequenceStatus::kWaitingForRemoteKv) {
      CRESCENT_LOG(kWarn) << "KV connector reported remote KV for " << id
                          << ", which is not waiting for it; ignored";
      continue;
    }
    Request& r = *it->second;
    if (event.status.is_ok()) {
      scheduler_.resume_after_remote_kv(&r.seq);
      continue;
    }
    // The connector reports a failure only once no peer can still write into the blocks, so
    // they are freed at once (not through finish(), which would keep them in limbo).
    scheduler_.finish(&r.seq);
    r.pending.finished = true;
    r.pending.finish_reason = FinishReason::kError;
    r.pending.error_message =
        event.status.message().empty() ? event.status.to_string() : event.status.message();
    r.pending.error_code = event.status.code();
    aborted_outputs_.push_back(take_output(r));
    requests_.erase(it);
  }
}

void Engine::start_remote_prefills(const ScheduleResult& schedule) {
  for (Sequence* seq : schedule.remote_prefills) {
    CRESCENT_CHECK(kv_connector_ != nullptr) << seq->request_id << " needs a KV connector";
    auto it = requests_.find(seq->request_id);
    CRESCENT_CHECK(it != requests_.end())
        << "admitted request " << seq->request_id << " is unknown";
    // num_computed_tokens is still the prefix-cache hit: whole blocks.
    kv_connector_->start_remote_prefill(seq->request_id, it->second->kv_transfer_params,
                                        seq->prompt_token_ids(), seq->block_table,
                                        seq->num_computed_tokens);
  }
}

void Engine::finish_remote(Request& r, FinishReason reason) {
  Sequence& seq = r.seq;
  const std::string& id = seq.request_id;
  if (seq.status == SequenceStatus::kWaitingForRemoteKv) {
    // A peer may be writing into the blocks: keep them until the connector reports.
    kv_connector_->cancel(id);
    const bool inserted = fetch_limbo_.emplace(id, take_blocks(seq)).second;
    CRESCENT_CHECK(inserted) << id << " is already in fetch limbo";
    return;
  }
  if (seq.needs_remote_kv) {
    // Ends before it was ever admitted: the prefill engine may already hold (or be computing)
    // this transfer's KV. Tell it through the "nothing to fetch" form of start_remote_prefill
    // (num_local_tokens covers every block the peer would send), so it frees at once instead
    // of at its deadline. No event follows.
    seq.needs_remote_kv = false;
    const int block_size = block_manager_.block_size();
    const int num_needed = std::max(0, seq.num_prompt_tokens - 1);
    const int all_local = (num_needed + block_size - 1) / block_size * block_size;
    kv_connector_->start_remote_prefill(id, r.kv_transfer_params, seq.prompt_token_ids(), {},
                                        all_local);
    return;
  }
  if (!r.kv_transfer_params.do_remote_decode) {
    return;  // decode side, KV arrived (or was all local): nothing pending at the connector
  }
  if (reason != FinishReason::kStop && reason != FinishReason::kLength) {
    kv_connector_->fail_remote_decode(
        id, r.kv_transfer_params,
        cancelled("the prefill request " + id + " ended with " + finish_reason_name(reason) +
                  (r.pending.error_message.empty() ? "" : ": " + r.pending.error_message) +
                  " before its KV was ready"));
    return;
  }
  // Register every full computed block first, so the prompt stays in the prefix cache after
  // the decode engine has read it and the blocks are released.
  block_manager_.commit_computed(seq);
  const int num_prompt_blocks =
      std::min(block_manager_.num_blocks_for_tokens(seq.num_prompt_tokens),
               static_cast<int>(seq.block_table.size()));
  const std::span<const int32_t> prompt_blocks =
      std::span<const int32_t>(seq.block_table).first(num_prompt_blocks);
  if (kv_connector_->hold_for_remote_decode(id, r.kv_transfer_params, seq.prompt_token_ids(),
                                            prompt_blocks)) {
    const bool inserted = held_for_remote_.emplace(id, take_blocks(seq)).second;
    CRESCENT_CHECK(inserted) << id << " is already held for a remote decode";
  }
}

Sequence Engine::take_blocks(Sequence& seq) {
  Sequence holder;
  holder.request_id = seq.request_id;
  holder.block_table = std::move(seq.block_table);
  holder.status = SequenceStatus::kFinished;
  seq.block_table.clear();
  seq.block_hashes.clear();
  seq.num_computed_tokens = 0;
  return holder;
}

void Engine::drop_remote_holds() {
  for (auto& [id, seq] : held_for_remote_) {
    kv_connector_->cancel(id);
    block_manager_.free(seq);
  }
  held_for_remote_.clear();
  for (auto& [id, seq] : fetch_limbo_) {
    block_manager_.free(seq);
  }
  fetch_limbo_.clear();
}

}  // namespace crescent::engine
