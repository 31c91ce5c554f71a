// The engine's P/D disaggregation hooks against a fake connector and the fake runner: a decode
// engine that gets its prompt's K/V from a "peer" (the test writing the fake KV cache) and a
// prefill engine that holds its blocks for one.

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/fake_kv_connector_test_util.h"

namespace crescent::engine {
namespace {

using testing::Collected;
using testing::fake_options;
using testing::FakeKvConnector;
using testing::FakeModelRunner;
using testing::kVocab;
using testing::run_alone;

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) {
    v.push_back((salt * 13 + i * 7 + i * i) % (kVocab - 1));
  }
  return v;
}

EngineRequest make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                           bool greedy = true) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  if (greedy) {
    r.sampling.temperature = 0;
  } else {
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = 10;
    r.sampling.seed = 77;
  }
  return r;
}

EngineRequest remote_prefill(EngineRequest r) {
  r.kv_transfer_params.do_remote_prefill = true;
  r.kv_transfer_params.transfer_id = "xfer-" + r.request_id;
  r.kv_transfer_params.remote_engine_id = "prefill-0";
  r.kv_transfer_params.remote_bootstrap_addr = "http://127.0.0.1:8998";
  return r;
}

EngineRequest remote_decode(EngineRequest r) {
  r.kv_transfer_params.do_remote_decode = true;
  r.kv_transfer_params.transfer_id = "xfer-" + r.request_id;
  return r;
}

// What the same request produces without kv_transfer_params, alone on a roomy engine.
Collected alone(EngineRequest r) {
  r.kv_transfer_params = {};
  return run_alone(r);
}

// Steps once, checking the invariants, and collects into `got`.
void step(Engine& engine, std::map<std::string, Collected>& got) {
  Result<std::vector<RequestOutput>> r = engine.step();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  testing::collect(*r, got);
  Status inv = engine.check_invariants();
  ASSERT_TRUE(inv.is_ok()) << inv.to_string();
}

int num_finished(const std::map<std::string, Collected>& got) {
  return static_cast<int>(
      std::ranges::count_if(got, [](const auto& kv) { return kv.second.finished; }));
}

// The peer's side of a fetch: writes the K/V of every token it is asked for.
void write_fetched_kv(FakeModelRunner& runner, const FakeKvConnector::Fetch& f) {
  const int64_t end = static_cast<int64_t>(f.prompt_token_ids.size()) - 1;
  runner.write_kv(f.prompt_token_ids, f.block_ids, f.num_local_tokens, end);
}

struct DecodeSide {
  FakeModelRunner runner{kVocab, 64, 4};
  FakeKvConnector connector;
  Engine engine;
  explicit DecodeSide(int num_blocks = 64, bool prefix_caching = true)
      : runner(kVocab, num_blocks, 4), engine(options(prefix_caching), &runner) {}
  EngineOptions options(bool prefix_caching) {
    EngineOptions o = fake_options();
    o.enable_prefix_caching = prefix_caching;
    o.kv_connector = &connector;
    return o;
  }
};

TEST(EngineKvTest, WaitingThenReadyComputesOnlyTheLastPromptToken) {
  DecodeSide d;
  const EngineRequest greedy = remote_prefill(make_request("g", prompt_of(10, 1), 6));
  const EngineRequest sampled = remote_prefill(make_request("s", prompt_of(13, 2), 6, false));
  ASSERT_TRUE(d.engine.add_request(greedy).is_ok());
  ASSERT_TRUE(d.engine.add_request(sampled).is_ok());
  std::map<std::string, Collected> got;
  for (int i = 0; i < 5; ++i) {
    step(d.engine, got);
  }
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(d.runner.num_tokens_computed(), 0) << "a parked request must not be computed";
  EXPECT_EQ(d.engine.stats().num_waiting_for_remote_kv, 2);
  EXPECT_EQ(d.engine.stats().num_running, 0);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 3 + 4);
  EXPECT_TRUE(d.engine.has_unfinished_requests());

  const std::vector<FakeKvConnector::Fetch> fetches = d.connector.fetches();
  ASSERT_EQ(fetches.size(), 2u);
  for (const FakeKvConnector::Fetch& f : fetches) {
    const EngineRequest& r = f.request_id == "g" ? greedy : sampled;
    EXPECT_EQ(f.prompt_token_ids, r.prompt_token_ids);
    EXPECT_EQ(f.block_ids.size(), (r.prompt_token_ids.size() + 3) / 4);
    EXPECT_EQ(f.num_local_tokens, 0);
    EXPECT_EQ(f.params.transfer_id, "xfer-" + r.request_id);
    EXPECT_EQ(f.params.remote_engine_id, "prefill-0");
    write_fetched_kv(d.runner, f);
    ASSERT_TRUE(d.connector.complete_fetch(f.request_id));
  }
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  // One prompt token (the last) and 5 decode steps each; the 6th token is never computed.
  EXPECT_EQ(d.runner.num_tokens_computed(), 2 * (1 + 5));
  for (const EngineRequest& r : {greedy, sampled}) {
    const Collected want = alone(r);
    EXPECT_EQ(got[r.request_id].tokens, want.tokens) << r.request_id;
    EXPECT_EQ(got[r.request_id].text, want.text) << r.request_id;
    EXPECT_EQ(got[r.request_id].reason, FinishReason::kLength);
  }
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(d.engine.stats().num_waiting_for_remote_kv, 0);
  EXPECT_TRUE(d.connector.cancels().empty());

  // The fetched blocks went into the prefix cache: a local request with the same prompt
  // finds the full blocks of the first 9 tokens (2 blocks) there.
  ASSERT_TRUE(d.engine.add_request(make_request("again", greedy.prompt_token_ids, 2)).is_ok());
  step(d.engine, got);
  EXPECT_EQ(got["again"].num_cached_tokens, 8);
}

TEST(EngineKvTest, ReadyWithErrorFailsTheRequestAndFreesItsBlocks) {
  DecodeSide d;
  ASSERT_TRUE(d.engine.add_request(remote_prefill(make_request("r", prompt_of(11, 3), 4))).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 3);
  ASSERT_TRUE(d.connector.complete_fetch("r", unavailable("prefill engine prefill-0 is gone")));
  step(d.engine, got);
  ASSERT_TRUE(got["r"].finished);
  EXPECT_EQ(got["r"].reason, FinishReason::kError);
  EXPECT_EQ(got["r"].error, "prefill engine prefill-0 is gone");
  EXPECT_TRUE(got["r"].tokens.empty());
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(d.engine.stats().num_waiting_for_remote_kv, 0);
  EXPECT_FALSE(d.engine.has_unfinished_requests());
  EXPECT_EQ(d.runner.num_tokens_computed(), 0);
}

TEST(EngineKvTest, AbortWhileParkedDeliversAbortAtOnceAndHoldsBlocksUntilTheConnectorReports) {
  DecodeSide d;
  ASSERT_TRUE(d.engine.add_request(remote_prefill(make_request("r", prompt_of(11, 4), 4))).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  ASSERT_EQ(d.engine.stats().num_waiting_for_remote_kv, 1);
  d.engine.abort("r");
  step(d.engine, got);
  ASSERT_TRUE(got["r"].finished) << "the abort must be delivered without waiting for the peer";
  EXPECT_EQ(got["r"].reason, FinishReason::kAbort);
  EXPECT_EQ(d.connector.cancels(), std::vector<std::string>{"r"});
  // The peer may still be writing: the blocks stay referenced, step after step.
  for (int i = 0; i < 3; ++i) {
    step(d.engine, got);
    EXPECT_EQ(d.engine.stats().num_blocks_used, 3);
    EXPECT_EQ(d.engine.stats().num_blocks_held_for_remote, 3);
    EXPECT_EQ(d.engine.stats().num_waiting_for_remote_kv, 0);
    EXPECT_TRUE(d.engine.has_unfinished_requests());
  }
  EXPECT_EQ(d.engine.add_request(make_request("r", prompt_of(3, 1), 1)).code(),
            StatusCode::kAlreadyExists)
      << "an id whose blocks are in limbo must not be reused yet";
  d.engine.abort("r");  // ignored: already finished
  ASSERT_TRUE(d.connector.complete_fetch("r", cancelled("cancelled")));
  step(d.engine, got);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(d.engine.stats().num_blocks_held_for_remote, 0);
  EXPECT_FALSE(d.engine.has_unfinished_requests());
  EXPECT_EQ(got["r"].num_outputs, 1);
}

TEST(EngineKvTest, AbortBeforeAdmissionTellsThePeerNothingIsNeeded) {
  DecodeSide d(/*num_blocks=*/4);
  // "busy" takes 3 of the 4 blocks, so "r" (3 blocks) stays queued, never admitted.
  ASSERT_TRUE(d.engine.add_request(make_request("busy", prompt_of(9, 7), 3)).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  ASSERT_TRUE(d.engine.add_request(remote_prefill(make_request("r", prompt_of(11, 4), 4))).is_ok());
  step(d.engine, got);
  ASSERT_EQ(d.engine.stats().num_waiting, 1);
  ASSERT_TRUE(d.connector.fetches().empty());
  d.engine.abort("r");
  step(d.engine, got);
  ASSERT_TRUE(got["r"].finished);
  EXPECT_EQ(got["r"].reason, FinishReason::kAbort);
  // The "nothing to fetch" form, so the prefill engine frees what it holds for the transfer.
  const auto fetches = d.connector.fetches();
  ASSERT_EQ(fetches.size(), 1u);
  EXPECT_TRUE(fetches[0].block_ids.empty());
  EXPECT_GE(fetches[0].num_local_tokens, 11 - 1);
  EXPECT_EQ(fetches[0].num_local_tokens % 4, 0);
  EXPECT_EQ(fetches[0].params.transfer_id, "xfer-r");
  d.engine.abort("busy");
  step(d.engine, got);
  EXPECT_FALSE(d.engine.has_unfinished_requests());
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

TEST(EngineKvTest, AbortAllWhileParkedKeepsBlocksUntilReported) {
  DecodeSide d;
  d.connector.set_report_on_cancel(true);
  ASSERT_TRUE(d.engine.add_request(remote_prefill(make_request("a", prompt_of(9, 5), 4))).is_ok());
  ASSERT_TRUE(d.engine.add_request(make_request("local", prompt_of(9, 6), 40)).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  d.engine.abort_all();
  EXPECT_EQ(d.engine.stats().num_blocks_held_for_remote, 3);
  step(d.engine, got);  // outputs, and the connector's report frees the limbo
  EXPECT_EQ(got["a"].reason, FinishReason::kAbort);
  EXPECT_EQ(got["local"].reason, FinishReason::kAbort);
  step(d.engine, got);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
  EXPECT_FALSE(d.engine.has_unfinished_requests());
}

TEST(EngineKvTest, FullLocalPrefixHitDoesNotWait) {
  DecodeSide d;
  const std::vector<int32_t> prompt = prompt_of(9, 7);  // 8 tokens to fetch = 2 full blocks
  std::map<std::string, Collected> got;
  ASSERT_TRUE(d.engine.add_request(make_request("warm", prompt, 1)).is_ok());
  step(d.engine, got);
  ASSERT_TRUE(got["warm"].finished);

  const EngineRequest r = remote_prefill(make_request("r", prompt, 5));
  ASSERT_TRUE(d.engine.add_request(r).is_ok());
  const int64_t computed_before = d.runner.num_tokens_computed();
  step(d.engine, got);
  EXPECT_EQ(got["r"].tokens.size(), 1u) << "scheduled in the step that admitted it";
  EXPECT_EQ(d.engine.stats().num_waiting_for_remote_kv, 0);
  ASSERT_EQ(d.connector.fetches().size(), 1u);
  EXPECT_EQ(d.connector.fetches()[0].num_local_tokens, 8);
  EXPECT_EQ(d.connector.fetches()[0].block_ids.size(), 3u);
  EXPECT_TRUE(d.connector.pending_fetches().empty());
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(d.runner.num_tokens_computed() - computed_before, 1 + 4);
  EXPECT_EQ(got["r"].tokens, alone(r).tokens);
  EXPECT_EQ(got["r"].num_cached_tokens, 8);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

TEST(EngineKvTest, PartialLocalPrefixHitFetchesOnlyTheRest) {
  DecodeSide d;
  const std::vector<int32_t> prefix = prompt_of(8, 8);
  std::map<std::string, Collected> got;
  ASSERT_TRUE(d.engine.add_request(make_request("warm", prefix, 1)).is_ok());
  step(d.engine, got);
  std::vector<int32_t> prompt = prefix;
  for (int32_t t : prompt_of(6, 9)) {
    prompt.push_back(t);
  }
  const EngineRequest r = remote_prefill(make_request("r", prompt, 4));
  ASSERT_TRUE(d.engine.add_request(r).is_ok());
  step(d.engine, got);
  ASSERT_EQ(d.engine.stats().num_waiting_for_remote_kv, 1);
  const FakeKvConnector::Fetch f = d.connector.pending_fetches().at("r");
  EXPECT_EQ(f.num_local_tokens, 8) << "'warm' computed and cached 2 full blocks";
  EXPECT_EQ(f.block_ids.size(), 4u);
  // Only the missing tokens are written; the cached block's K/V is the engine's own.
  write_fetched_kv(d.runner, f);
  const int64_t computed_before = d.runner.num_tokens_computed();
  ASSERT_TRUE(d.connector.complete_fetch("r"));
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(d.runner.num_tokens_computed() - computed_before, 1 + 3);
  EXPECT_EQ(got["r"].tokens, alone(r).tokens);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

TEST(EngineKvTest, ParkedRequestsAreNeverPreempted) {
  // 12 blocks of 4: the parked request holds 4, three local requests of up to 16 tokens
  // (4 blocks each) fight over the other 8 and preempt each other.
  DecodeSide d(12);
  const EngineRequest r = remote_prefill(make_request("parked", prompt_of(16, 10), 3));
  ASSERT_TRUE(d.engine.add_request(r).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  ASSERT_EQ(d.engine.stats().num_waiting_for_remote_kv, 1);
  // The peer writes right away; had the blocks been handed to another request, that one's
  // tokens would overwrite these slots (and the fake runner's reads would disagree).
  write_fetched_kv(d.runner, d.connector.pending_fetches().at("parked"));
  std::vector<EngineRequest> locals;
  for (int i = 0; i < 3; ++i) {
    locals.push_back(make_request("l" + std::to_string(i), prompt_of(6, 20 + i), 10));
    ASSERT_TRUE(d.engine.add_request(locals.back()).is_ok());
  }
  for (int i = 0; i < 200 && num_finished(got) < 3; ++i) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(d.engine.stats().num_waiting_for_remote_kv, 1);
  }
  EXPECT_GT(d.engine.stats().num_preemptions_total, 0) << "the test must cause preemption";
  ASSERT_TRUE(d.connector.complete_fetch("parked"));
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(got["parked"].tokens, alone(r).tokens);
  for (const EngineRequest& l : locals) {
    EXPECT_EQ(got[l.request_id].tokens, alone(l).tokens) << l.request_id;
  }
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

TEST(EngineKvTest, PreemptedAfterItsKvArrivedRecomputesLocally) {
  // 6 blocks of 4: the remote request (prompt 9, 3 blocks, up to 20 tokens = 5 blocks) and a
  // more senior local one cannot both grow, so the younger remote one is preempted after its
  // KV arrived, and recomputes like any other: no second fetch.
  DecodeSide d(6);
  const EngineRequest local = make_request("local", prompt_of(4, 11), 10);
  const EngineRequest r = remote_prefill(make_request("r", prompt_of(9, 12), 11));
  ASSERT_TRUE(d.engine.add_request(local).is_ok());
  ASSERT_TRUE(d.engine.add_request(r).is_ok());
  std::map<std::string, Collected> got;
  step(d.engine, got);
  write_fetched_kv(d.runner, d.connector.pending_fetches().at("r"));
  ASSERT_TRUE(d.connector.complete_fetch("r"));
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_GT(d.engine.stats().num_preemptions_total, 0);
  EXPECT_EQ(d.connector.fetches().size(), 1u);
  EXPECT_EQ(got["r"].tokens, alone(r).tokens);
  EXPECT_EQ(got["local"].tokens, alone(local).tokens);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

TEST(EngineKvTest, RemoteRequestsWithoutAConnectorAreRefused) {
  FakeModelRunner runner(kVocab, 16, 4);
  Engine engine(fake_options(), &runner);
  for (const EngineRequest& r : {remote_prefill(make_request("p", prompt_of(5, 1), 2)),
                                 remote_decode(make_request("d", prompt_of(5, 1), 1))}) {
    Status s = engine.validate_request(r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("this server has no KV connector; start it with --role "
                               "prefill|decode"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(engine.add_request(r).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(engine.has_unfinished_requests());

  FakeKvConnector connector;
  EngineOptions o = fake_options();
  o.kv_connector = &connector;
  Engine with(o, &runner);
  EngineRequest both = remote_decode(remote_prefill(make_request("b", prompt_of(5, 1), 1)));
  Status s = with.add_request(both);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cannot both"), std::string::npos) << s.message();
}

struct PrefillSide {
  FakeModelRunner runner;
  FakeKvConnector connector;
  Engine engine;
  explicit PrefillSide(int num_blocks = 64, int max_batched_tokens = 64)
      : runner(kVocab, num_blocks, 4), engine(options(max_batched_tokens), &runner) {}
  EngineOptions options(int max_batched_tokens) {
    EngineOptions o = fake_options();
    o.max_num_batched_tokens = max_batched_tokens;
    o.kv_connector = &connector;
    return o;
  }
};

TEST(EngineKvTest, HeldBlocksStayUntilReleasedThenStayCached) {
  // 8 blocks of 4; the held prompt takes 3, and local traffic that needs every free block runs
  // meanwhile: the held blocks must not be handed out.
  PrefillSide p(8);
  const EngineRequest r = remote_decode(make_request("p", prompt_of(10, 13), 1));
  ASSERT_TRUE(p.engine.add_request(r).is_ok());
  std::map<std::string, Collected> got;
  step(p.engine, got);
  ASSERT_TRUE(got["p"].finished);
  EXPECT_EQ(got["p"].reason, FinishReason::kLength);
  EXPECT_EQ(got["p"].tokens, alone(r).tokens);
  ASSERT_EQ(p.connector.holds().size(), 1u);
  const FakeKvConnector::Hold h = p.connector.holds()[0];
  EXPECT_EQ(h.prompt_token_ids, r.prompt_token_ids);
  ASSERT_EQ(h.block_ids.size(), 3u);
  EXPECT_EQ(h.params.transfer_id, "xfer-p");
  EXPECT_TRUE(p.runner.holds_kv(h.prompt_token_ids, h.block_ids, 0, 10));
  EXPECT_EQ(p.engine.stats().num_blocks_used, 3);
  EXPECT_EQ(p.engine.stats().num_blocks_held_for_remote, 3);
  EXPECT_EQ(p.engine.stats().num_running, 0);
  EXPECT_TRUE(p.engine.has_unfinished_requests());

  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(
        p.engine.add_request(make_request("l" + std::to_string(i), prompt_of(7, 30 + i), 13))
            .is_ok());
  }
  for (int i = 0; i < 500 && num_finished(got) < 5; ++i) {
    step(p.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  ASSERT_EQ(num_finished(got), 5);
  EXPECT_TRUE(p.runner.holds_kv(h.prompt_token_ids, h.block_ids, 0, 10))
      << "held blocks were reused while the decode engine may still read them";
  EXPECT_EQ(p.engine.stats().num_blocks_used, 3);
  EXPECT_TRUE(p.connector.cancels().empty());

  ASSERT_TRUE(p.connector.release_hold("p"));
  step(p.engine, got);
  EXPECT_EQ(p.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(p.engine.stats().num_blocks_held_for_remote, 0);
  EXPECT_FALSE(p.engine.has_unfinished_requests());
  // The prompt's 2 full blocks stayed in the prefix cache.
  ASSERT_TRUE(p.engine.add_request(make_request("again", r.prompt_token_ids, 1)).is_ok());
  step(p.engine, got);
  EXPECT_EQ(got["again"].num_cached_tokens, 8);
}

TEST(EngineKvTest, HoldRefusedFreesAtOnce) {
  PrefillSide p;
  p.connector.set_hold_result(false);
  ASSERT_TRUE(p.engine.add_request(remote_decode(make_request("p", prompt_of(10, 14), 1))).is_ok());
  std::map<std::string, Collected> got;
  step(p.engine, got);
  ASSERT_TRUE(got["p"].finished);
  EXPECT_EQ(p.connector.holds().size(), 1u);
  EXPECT_EQ(p.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(p.engine.stats().num_blocks_held_for_remote, 0);
  EXPECT_FALSE(p.engine.has_unfinished_requests());
}

TEST(EngineKvTest, StopTokenFinishAlsoHolds) {
  PrefillSide p;
  EngineRequest r = remote_decode(make_request("p", prompt_of(6, 15), 5));
  const Collected want = alone(r);
  r.sampling.stop_token_ids = {want.tokens[0]};
  ASSERT_TRUE(p.engine.add_request(r).is_ok());
  std::map<std::string, Collected> got;
  step(p.engine, got);
  EXPECT_EQ(got["p"].reason, FinishReason::kStop);
  EXPECT_EQ(p.connector.holds().size(), 1u);
  EXPECT_EQ(p.engine.stats().num_blocks_held_for_remote, 2);
}

TEST(EngineKvTest, AbortOrFailureBeforeTheFinishFailsTheRemoteDecode) {
  // Chunks of 4 tokens: a 12-token prompt is still prefilling when aborted.
  PrefillSide p(64, 4);
  ASSERT_TRUE(p.engine.add_request(remote_decode(make_request("a", prompt_of(12, 16), 1))).is_ok());
  ASSERT_TRUE(p.engine.add_request(remote_decode(make_request("q", prompt_of(12, 17), 1))).is_ok());
  std::map<std::string, Collected> got;
  step(p.engine, got);
  p.engine.abort("a");  // running, mid-prefill
  p.engine.abort("q");  // still queued
  step(p.engine, got);
  EXPECT_EQ(got["a"].reason, FinishReason::kAbort);
  EXPECT_EQ(got["q"].reason, FinishReason::kAbort);
  std::vector<std::string> failed = p.connector.failed_decodes();
  std::ranges::sort(failed);
  EXPECT_EQ(failed, (std::vector<std::string>{"a", "q"}));
  EXPECT_NE(p.connector.last_fail_message().find("ended with abort"), std::string::npos)
      << p.connector.last_fail_message();
  EXPECT_TRUE(p.connector.holds().empty());
  EXPECT_EQ(p.engine.stats().num_blocks_used, 0);

  // A runner failure fails the batch's requests: the connector hears about it too.
  ASSERT_TRUE(p.engine.add_request(remote_decode(make_request("f", prompt_of(3, 18), 1))).is_ok());
  p.runner.fail_on_call(p.runner.num_calls());
  step(p.engine, got);
  EXPECT_EQ(got["f"].reason, FinishReason::kError);
  EXPECT_EQ(p.connector.failed_decodes().back(), "f");
  EXPECT_NE(p.connector.last_fail_message().find("ended with error"), std::string::npos)
      << p.connector.last_fail_message();
  EXPECT_TRUE(p.connector.holds().empty());
  EXPECT_FALSE(p.engine.has_unfinished_requests());
}

TEST(EngineKvTest, PrefillToDecodeThroughTwoEngines) {
  // P prefills and holds; the "transfer" copies P's slots into D's blocks; D decodes. D's
  // output equals a local run's, and D computed one prompt token.
  PrefillSide p;
  DecodeSide d;
  const std::vector<int32_t> prompt = prompt_of(19, 19);
  const EngineRequest on_p = remote_decode(make_request("x", prompt, 1));
  const EngineRequest on_d = remote_prefill(make_request("x", prompt, 8));
  ASSERT_TRUE(p.engine.add_request(on_p).is_ok());
  ASSERT_TRUE(d.engine.add_request(on_d).is_ok());
  std::map<std::string, Collected> got_p, got_d;
  step(p.engine, got_p);
  step(d.engine, got_d);
  const FakeKvConnector::Hold h = p.connector.pending_holds().at("x");
  const FakeKvConnector::Fetch f = d.connector.pending_fetches().at("x");
  // A real transfer copies blocks; the fake cache stores (token, position), so copying means
  // writing what P's blocks hold, checked first.
  ASSERT_TRUE(p.runner.holds_kv(h.prompt_token_ids, h.block_ids, 0, 18));
  d.runner.write_kv(h.prompt_token_ids, f.block_ids, f.num_local_tokens, 18);
  ASSERT_TRUE(d.connector.complete_fetch("x"));
  ASSERT_TRUE(p.connector.release_hold("x"));
  while (d.engine.has_unfinished_requests() || p.engine.has_unfinished_requests()) {
    step(p.engine, got_p);
    step(d.engine, got_d);
    ASSERT_FALSE(HasFatalFailure());
  }
  const Collected want = alone(on_d);
  EXPECT_EQ(got_d["x"].tokens, want.tokens);
  EXPECT_EQ(got_d["x"].tokens[0], got_p["x"].tokens[0]) << "P's first token is D's first";
  EXPECT_EQ(d.runner.num_tokens_computed(), 1 + 7);
  EXPECT_EQ(p.engine.stats().num_blocks_used, 0);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

// A decode engine of a vision-language model loads no vision tower: an image request whose
// prompt KV comes from the prefill engine is taken without embeddings or encoder input, and
// only its last prompt token (text) is computed here.
EngineRequest image_request(const std::string& id, int max_tokens) {
  EngineRequest r = make_request(id, prompt_of(14, 5), max_tokens);
  MultiModalItem item;
  item.mm_hash = "img-" + id;
  item.offset = 3;
  item.num_tokens = 4;
  item.llm_grid_h = 2;
  item.llm_grid_w = 2;
  r.mm_items.push_back(item);
  return r;
}

TEST(EngineKvTest, DecodeSideWithoutEncoderTakesRemoteImageRequests) {
  DecodeSide d;
  EXPECT_EQ(d.engine.add_request(image_request("local", 4)).code(), StatusCode::kInvalidArgument)
      << "a local prefill of an image needs an encoder";
  Status added = d.engine.add_request(remote_prefill(image_request("r", 4)));
  ASSERT_TRUE(added.is_ok()) << added.to_string();
  std::map<std::string, Collected> got;
  step(d.engine, got);
  const std::vector<FakeKvConnector::Fetch> fetches = d.connector.fetches();
  ASSERT_EQ(fetches.size(), 1u);
  write_fetched_kv(d.runner, fetches[0]);
  ASSERT_TRUE(d.connector.complete_fetch("r"));
  while (d.engine.has_unfinished_requests()) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(got["r"].reason, FinishReason::kLength) << got["r"].error;
  EXPECT_EQ(got["r"].tokens.size(), 4u);
  EXPECT_EQ(d.runner.num_tokens_computed(), 1 + 3);
}

// If such a request ever had to prefill its image here (preempted after its KV arrived and
// recomputed without a prefix cache), it fails with a clear error instead of crashing.
TEST(EngineKvTest, DecodeSideWithoutEncoderFailsARecomputedImage) {
  DecodeSide d(/*num_blocks=*/9, /*prefix_caching=*/false);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(d.engine.add_request(remote_prefill(image_request(id, 16))).is_ok());
  }
  std::map<std::string, Collected> got;
  step(d.engine, got);
  for (const FakeKvConnector::Fetch& f : d.connector.fetches()) {
    write_fetched_kv(d.runner, f);
    ASSERT_TRUE(d.connector.complete_fetch(f.request_id));
  }
  for (int i = 0; i < 200 && d.engine.has_unfinished_requests(); ++i) {
    step(d.engine, got);
    ASSERT_FALSE(HasFatalFailure());
  }
  ASSERT_GT(d.engine.stats().num_preemptions_total, 0) << "the test needs a preemption";
  int num_failed = 0;
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(got[id].finished) << id;
    if (got[id].reason == FinishReason::kError) {
      ++num_failed;
      EXPECT_NE(got[id].error.find("no vision encoder"), std::string::npos) << got[id].error;
    }
  }
  EXPECT_GE(num_failed, 1);
  EXPECT_EQ(d.engine.stats().num_blocks_used, 0);
}

}  // namespace
}  // namespace crescent::engine
