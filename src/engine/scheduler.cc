#include "engine/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <span>

#include "core/check.h"

namespace crescent::engine {

Scheduler::Scheduler(SchedulerOptions options, BlockManager* block_manager)
    : options_(options), block_manager_(block_manager) {
  CRESCENT_CHECK(options_.max_num_seqs > 0 && options_.max_num_batched_tokens > 0)
      << "bad scheduler options";
}

void Scheduler::add(Sequence* seq) {
  CRESCENT_CHECK(seq->block_table.empty() && seq->num_computed_tokens == 0)
      << seq->request_id << " already holds blocks";
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::insert_running(Sequence* seq) {
  auto pos = std::upper_bound(
      running_.begin(), running_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  running_.insert(pos, seq);
}

Sequence* Scheduler::pick_victim() const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!(*it)->is_scheduled_this_step) {
      return *it;
    }
  }
  return nullptr;
}

void Scheduler::preempt(Sequence* victim, ScheduleResult& result) {
  std::erase(running_, victim);
  block_manager_->free(*victim);
  victim->status = SequenceStatus::kPreempted;
  ++victim->num_preemptions;
  waiting_.push_front(victim);
  result.preempted.push_back(victim);
}

ScheduleResult Scheduler::schedule() {
  ScheduleResult result;
  int budget = options_.max_num_batched_tokens;
  for (Sequence* seq : running_) {
    seq->is_scheduled_this_step = false;
  }

  auto schedule_seq = [&](Sequence* seq) {
    const int num_left = seq->num_tokens() - seq->num_computed_tokens;
    CRESCENT_CHECK(num_left > 0) << seq->request_id << " has nothing to compute";
    const int num_new = std::min(num_left, budget);
    budget -= num_new;
    result.num_batched_tokens += num_new;
    seq->is_scheduled_this_step = true;
    result.scheduled.push_back({seq, num_new, num_new == num_left});
  };

  // Decodes first, then chunks of prompts already running; each in arrival order.
  std::vector<Sequence*> order;
  order.reserve(running_.size());
  for (Sequence* seq : running_) {
    if (seq->num_tokens() - seq->num_computed_tokens == 1) {
      order.push_back(seq);
    }
  }
  for (Sequence* seq : running_) {
    if (seq->num_tokens() - seq->num_computed_tokens > 1) {
      order.push_back(seq);
    }
  }
  for (Sequence* seq : order) {
    if (budget == 0) {
      break;
    }
    if (seq->status != SequenceStatus::kRunning) {
      continue;  // preempted earlier in this loop
    }
    bool preempted_self = false;
    while (!block_manager_->can_append(*seq)) {
      Sequence* victim = pick_victim();
      CRESCENT_CHECK(victim != nullptr) << "no preemption victim";
      preempt(victim, result);
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) {
      continue;
    }
    block_manager_->append_slots(*seq);
    schedule_seq(seq);
  }

  // New and preempted requests, oldest first; none while this step had to preempt (there is
  // no room to spare), and none past a head that does not fit (no overtaking). A new request
  // that waits for a running prefill of its prompt's prefix (waits_for_shared_prefill) is
  // passed over for this step.
  for (auto it = waiting_.begin();
       result.preempted.empty() && budget > 0 && it != waiting_.end() &&
       static_cast<int>(running_.size() + parked_.size()) < options_.max_num_seqs;) {
    Sequence* seq = *it;
    if (waits_for_shared_prefill(*seq)) {
      ++it;
      continue;
    }
    if (!block_manager_->can_allocate_for_prompt(*seq)) {
      break;
    }
    it = waiting_.erase(it);
    const int num_cached = block_manager_->allocate_for_prompt(*seq);
    if (!seq->has_been_scheduled) {
      seq->num_cached_tokens = num_cached;
      seq->has_been_scheduled = true;
    }
    if (seq->needs_remote_kv) {
      seq->needs_remote_kv = false;
      result.remote_prefills.push_back(seq);
      if (num_cached < seq->num_prompt_tokens - 1) {
        seq->status = SequenceStatus::kWaitingForRemoteKv;
        parked_.push_back(seq);
        continue;
      }
    }
    seq->status = SequenceStatus::kRunning;
    insert_running(seq);
    schedule_seq(seq);
  }
  return result;
}

bool Scheduler::waits_for_shared_prefill(const Sequence& seq) const {
  // Only a new text prompt: a preempted one has waited already, a remote prefill's KV does not
  // come from here, and equal placeholder tokens of two images do not make equal K/V.
  if (!block_manager_->is_prefix_caching_enabled() || seq.has_been_scheduled ||
      seq.needs_remote_kv || !seq.mm_placeholders.empty()) {
    return false;
  }
  const int block_size = block_manager_->block_size();
  const std::span<const int32_t> prompt = seq.prompt_token_ids();
  // Worth a wait: at least one block, and at least half of this prompt.
  const size_t min_shared =
      static_cast<size_t>(std::max<int>(block_size, (seq.num_prompt_tokens + 1) / 2));
  for (const Sequence* other : running_) {
    if (other->num_computed_tokens >= other->num_prompt_tokens || !other->mm_placeholders.empty()) {
      continue;  // prefilled already (its blocks are cached), or not comparable
    }
    const std::span<const int32_t> theirs = other->prompt_token_ids();
    const size_t n = std::min(prompt.size(), theirs.size());
    const size_t common = static_cast<size_t>(
        std::mismatch(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n),
                      theirs.begin())
            .first -
        prompt.begin());
    const size_t cacheable = common / static_cast<size_t>(block_size) * block_size;
    // Worth it only while some of those blocks are still to be computed by `other`.
    if (cacheable >= min_shared && static_cast<size_t>(other->num_computed_tokens) < cacheable) {
      return true;
    }
  }
  return false;
}

void Scheduler::on_computed(const ScheduleResult& result) {
  for (const ScheduledSeq& s : result.scheduled) {
    if (s.seq->status != SequenceStatus::kRunning) {
      continue;  // finished (aborted) since it was scheduled
    }
    s.seq->num_computed_tokens += s.num_new_tokens;
    CRESCENT_CHECK_LE(s.seq->num_computed_tokens, s.seq->num_tokens());
    block_manager_->commit_computed(*s.seq);
  }
}

void Scheduler::resume_after_remote_kv(Sequence* seq) {
  CRESCENT_CHECK(seq->status == SequenceStatus::kWaitingForRemoteKv)
      << seq->request_id << " is not waiting for remote KV";
  std::erase(parked_, seq);
  // Only the last prompt token is left to compute: its logits give the first output token.
  seq->num_computed_tokens = seq->num_prompt_tokens - 1;
  CRESCENT_CHECK_EQ(seq->num_tokens(), seq->num_prompt_tokens);
  block_manager_->commit_computed(*seq);
  seq->status = SequenceStatus::kRunning;
  insert_running(seq);
}

void Scheduler::finish(Sequence* seq) {
  if (seq->status == SequenceStatus::kRunning) {
    std::erase(running_, seq);
  } else if (seq->status == SequenceStatus::kWaitingForRemoteKv) {
    std::erase(parked_, seq);
  } else if (seq->status == SequenceStatus::kWaiting || seq->status == SequenceStatus::kPreempted) {
    std::erase(waiting_, seq);
  }
  block_manager_->free(*seq);
  seq->status = SequenceStatus::kFinished;
}

}  // namespace crescent::engine
