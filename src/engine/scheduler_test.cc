#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>

namespace crescent::engine {
namespace {

struct Fixture {
  Fixture(int num_blocks, int block_size, SchedulerOptions options)
      : bm(num_blocks, block_size, true), scheduler(options, &bm) {}
  Sequence* add(const std::string& id, int num_tokens) {
    auto s = std::make_unique<Sequence>();
    s->request_id = id;
    s->token_ids.resize(num_tokens);
    std::iota(s->token_ids.begin(), s->token_ids.end(), static_cast<int32_t>(seqs.size() * 1000));
    s->num_prompt_tokens = num_tokens;
    s->arrival_order = seqs.size();
    scheduler.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // Computes the schedule and "samples" a token for each sequence whose logits were wanted.
  ScheduleResult step() {
    ScheduleResult r = scheduler.schedule();
    scheduler.on_computed(r);
    for (const ScheduledSeq& s : r.scheduled) {
      if (s.needs_logits) {
        s.seq->token_ids.push_back(7);
      }
    }
    return r;
  }
  BlockManager bm;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

TEST(SchedulerTest, ChunksLongPromptsUnderTheTokenBudget) {
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 10});
  Sequence* a = f.add("a", 25);
  ScheduleResult r = f.step();
  ASSERT_EQ(r.scheduled.size(), 1u);
  EXPECT_EQ(r.scheduled[0].num_new_tokens, 10);
  EXPECT_FALSE(r.scheduled[0].needs_logits);
  r = f.step();
  EXPECT_EQ(r.scheduled[0].num_new_tokens, 10);
  r = f.step();
  EXPECT_EQ(r.scheduled[0].num_new_tokens, 5);
  EXPECT_TRUE(r.scheduled[0].needs_logits);
  EXPECT_EQ(a->num_computed_tokens, 25);
  EXPECT_EQ(a->num_tokens(), 26);
}

TEST(SchedulerTest, DecodesGoBeforePrefillChunks) {
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 8});
  Sequence* a = f.add("a", 3);
  f.step();  // a prefilled, now decoding
  Sequence* b = f.add("b", 20);
  ScheduleResult r = f.step();
  ASSERT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(r.scheduled[0].seq, a);
  EXPECT_EQ(r.scheduled[0].num_new_tokens, 1);
  EXPECT_EQ(r.scheduled[1].seq, b);
  EXPECT_EQ(r.scheduled[1].num_new_tokens, 7);
  EXPECT_EQ(r.num_batched_tokens, 8);
  // b is mid-prompt and older than c: a's decode, then b's chunk, then nothing for c.
  Sequence* c = f.add("c", 5);
  r = f.step();
  ASSERT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(r.scheduled[0].seq, a);
  EXPECT_EQ(r.scheduled[1].seq, b);
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
}

TEST(SchedulerTest, MaxNumSeqsCapsRunning) {
  Fixture f(64, 4, {.max_num_seqs = 2, .max_num_batched_tokens = 100});
  f.add("a", 3);
  f.add("b", 3);
  Sequence* c = f.add("c", 3);
  ScheduleResult r = f.step();
  EXPECT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(f.scheduler.num_running(), 2);
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
}

TEST(SchedulerTest, PreemptsTheMostRecentArrivalAndRequeuesItFirst) {
  // 4 blocks of 2 tokens. a and b take 2 blocks each; a's decode then needs a fifth block.
  Fixture f(4, 2, {.max_num_seqs = 8, .max_num_batched_tokens = 100});
  Sequence* a = f.add("a", 4);
  Sequence* b = f.add("b", 4);
  f.step();  // both prefilled: 5 tokens each, 1 uncomputed, 2 blocks each
  ScheduleResult r = f.step();
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0], b);
  EXPECT_EQ(b->status, SequenceStatus::kPreempted);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(b->num_computed_tokens, 0);
  ASSERT_EQ(r.scheduled.size(), 1u);
  EXPECT_EQ(r.scheduled[0].seq, a);
  EXPECT_EQ(f.scheduler.waiting().front(), b);
  Status s = f.bm.check_invariants(std::vector<const Sequence*>{a, b});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

}  // namespace
}  // namespace crescent::engine
