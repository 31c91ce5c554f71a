#pragma once
// Scheduler: continuous batching over Sequences. Each step it picks what to compute under a
// token budget (max_num_batched_tokens; long prompts are split into chunks over several
// steps) and a sequence cap (max_num_seqs). Running decodes go first, then running prompts'
// next chunks, then new or preempted requests in arrival order. Capacity (KV blocks) is
// checked separately from the budget: a request is admitted only when all blocks for its
// known tokens can be allocated, and when a running sequence needs a block that is not free,
// the most recently arrived running sequence not yet scheduled this step is preempted: its
// blocks are freed and it goes back to the front of the queue, to be recomputed later.
// A request whose prompt K/V comes from a remote prefill (needs_remote_kv) is admitted the same
// way, but unless the prefix cache already covers its prompt it is then parked
// (kWaitingForRemoteKv): it holds its blocks, is never scheduled or preempted, and counts
// toward max_num_seqs but not the token budget, until resume_after_remote_kv().
// With prefix caching, a new request whose prompt shares at least half of itself (and at least
// one full block) with a prompt still being prefilled waits until that prefill is done, and
// then takes those blocks from the prefix cache instead of computing them again: the choices
// of an n > 1 or best_of request, or a burst of one long prompt, compute their prompt once.
// Requests behind a waiting one may go first.
// It never sees a tensor. Not thread-safe.

#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace crescent::engine {

struct SchedulerOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int num_new_tokens = 0;     // tokens to compute, from seq->num_computed_tokens on
  bool needs_logits = false;  // the chunk reaches the last known token: sample after it
};

struct ScheduleResult {
  std::vector<ScheduledSeq> scheduled;  // in the order the runner gets them
  std::vector<Sequence*> preempted;     // lost their blocks this step
  // Admitted this step with needs_remote_kv (now cleared): parked, or scheduled at once when
  // the prefix cache covered all but the last prompt token. Their remote fetch is to start.
  std::vector<Sequence*> remote_prefills;
  int num_batched_tokens = 0;
  bool is_empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, BlockManager* block_manager);

  // Queues a new sequence (status kWaiting). Validation is the caller's job.
  void add(Sequence* seq);
  ScheduleResult schedule();
  // After the runner computed a schedule: advances num_computed_tokens and registers newly
  // full blocks with the prefix cache.
  void on_computed(const ScheduleResult& result);
  // A parked sequence's blocks now hold the K/V of prompt tokens [0, num_prompt_tokens - 1):
  // registers the full ones with the prefix cache and runs it (the last prompt token next).
  void resume_after_remote_kv(Sequence* seq);
  // Removes seq wherever it is, frees its blocks and marks it finished.
  void finish(Sequence* seq);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_parked() const { return static_cast<int>(parked_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& parked() const { return parked_; }

 private:
  void preempt(Sequence* victim, ScheduleResult& result);
  Sequence* pick_victim() const;
  void insert_running(Sequence* seq);
  // A new request that should wait for a running prefill of its prompt's prefix (see above).
  bool waits_for_shared_prefill(const Sequence& seq) const;

  SchedulerOptions options_;
  BlockManager* block_manager_;
  std::vector<Sequence*> running_;  // sorted by arrival_order
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> parked_;  // kWaitingForRemoteKv, in admission order
};

}  // namespace crescent::engine
