#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>

namespace crescent::engine {
namespace {

struct Fixture {
  Fixture(int num_blocks, int block_size, SchedulerOptions options)
      : bm(num_blocks, block_size, true), scheduler(options, &bm) {}
  Sequence* add(const std::string& id, int num_tokens) {
    std::vector<int32_t> tokens(static_cast<size_t>(num_tokens));
    std::iota(tokens.begin(), tokens.end(), static_cast<int32_t>(seqs.size() * 1000));
    return add_prompt(id, std::move(tokens));
  }
  Sequence* add_prompt(const std::string& id, std::vector<int32_t> tokens) {
    auto s = std::make_unique<Sequence>();
    s->request_id = id;
    s->num_prompt_tokens = static_cast<int>(tokens.size());
    s->token_ids = std::move(tokens);
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

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(SchedulerTest, ARepeatedPromptWaitsForThePrefillAndTakesItsBlocksFromTheCache) {
  // The choices of an n = 3 request: one prompt of 3 full blocks and a bit.
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 100});
  Sequence* a = f.add_prompt("a/0", iota_tokens(14));
  Sequence* b = f.add_prompt("a/1", iota_tokens(14));
  Sequence* c = f.add_prompt("a/2", iota_tokens(14));
  ScheduleResult r = f.step();
  ASSERT_EQ(r.scheduled.size(), 1u);
  EXPECT_EQ(r.scheduled[0].seq, a);
  EXPECT_EQ(r.num_batched_tokens, 14);
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  // a's prompt is computed: the others take its 3 full blocks and compute only the rest.
  r = f.step();
  ASSERT_EQ(r.scheduled.size(), 3u);
  EXPECT_EQ(b->num_cached_tokens, 12);
  EXPECT_EQ(c->num_cached_tokens, 12);
  EXPECT_EQ(r.num_batched_tokens, 1 + 2 + 2);
  EXPECT_EQ(b->block_table[0], a->block_table[0]);
}

TEST(SchedulerTest, ARepeatedPromptWaitsThroughEveryChunkOfTheFirst) {
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 8});
  Sequence* a = f.add_prompt("a", iota_tokens(20));
  Sequence* b = f.add_prompt("b", iota_tokens(20));
  f.step();  // a: 8 of 20
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  f.step();  // a: 16 of 20
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  ScheduleResult r = f.step();  // a: the last 4, its first token; b still waits
  EXPECT_EQ(a->num_computed_tokens, 20);
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  r = f.step();
  EXPECT_EQ(b->status, SequenceStatus::kRunning);
  EXPECT_EQ(b->num_cached_tokens, 16);  // 20 tokens: 5 blocks, the last computed again
}

TEST(SchedulerTest, RequestsBehindAWaitingRepeatGoFirst) {
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 100});
  f.add_prompt("a", iota_tokens(12));
  Sequence* b = f.add_prompt("b", iota_tokens(12));
  Sequence* other = f.add_prompt("other", iota_tokens(12, 5000));
  ScheduleResult r = f.step();
  ASSERT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(r.scheduled[1].seq, other);
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
}

TEST(SchedulerTest, AShortSharedPrefixDoesNotMakeARequestWait) {
  Fixture f(64, 4, {.max_num_seqs = 8, .max_num_batched_tokens = 100});
  // One block in common (a system prompt), of 5: not worth waiting for.
  std::vector<int32_t> tail = iota_tokens(20, 7000);
  std::vector<int32_t> head = iota_tokens(4);
  std::vector<int32_t> a_prompt = iota_tokens(20);
  std::vector<int32_t> b_prompt = head;
  b_prompt.insert(b_prompt.end(), tail.begin() + 4, tail.end());
  f.add_prompt("a", a_prompt);
  Sequence* b = f.add_prompt("b", b_prompt);
  ScheduleResult r = f.step();
  EXPECT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(b->status, SequenceStatus::kRunning);
}

TEST(SchedulerTest, WithoutPrefixCachingRepeatsDoNotWait) {
  BlockManager bm(64, 4, /*enable_prefix_caching=*/false);
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 100}, &bm);
  Sequence a, b;
  for (Sequence* s : {&a, &b}) {
    s->token_ids = iota_tokens(12);
    s->num_prompt_tokens = 12;
    scheduler.add(s);
  }
  b.arrival_order = 1;
  EXPECT_EQ(scheduler.schedule().scheduled.size(), 2u);
  scheduler.finish(&a);
  scheduler.finish(&b);
}

}  // namespace
}  // namespace crescent::engine
