#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "core/clock.h"
#include "engine/engine_test_util.h"
#include "engine/fake_kv_connector_test_util.h"

namespace crescent::engine {
namespace {

using testing::fake_options;
using testing::FakeKvConnector;
using testing::FakeModelRunner;
using testing::kVocab;

// Records every output per request and checks, as they arrive, that a request's outputs come
// in order: token counts only grow, nothing follows the final one.
class Recorder {
 public:
  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu_);
      State& s = states_[o.request_id];
      EXPECT_FALSE(s.finished) << "output after the final one for " << o.request_id;
      EXPECT_EQ(o.num_output_tokens, s.num_tokens + static_cast<int>(o.new_token_ids.size()))
          << o.request_id;
      s.num_tokens = o.num_output_tokens;
      s.tokens.insert(s.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        s.finished = true;
        s.reason = o.finish_reason;
        ++num_finished_;
      }
    };
  }
  int num_finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return num_finished_;
  }
  struct State {
    std::vector<int32_t> tokens;
    int num_tokens = 0;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
  };
  std::map<std::string, State> states() {
    std::lock_guard<std::mutex> lock(mu_);
    return states_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, State> states_;
  int num_finished_ = 0;
};

EngineRequest request(const std::string& id, int salt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < 3 + salt % 20; ++i) {
    r.prompt_token_ids.push_back((salt * 7 + i * 3) % (kVocab - 1));
  }
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  return r;
}

// (GCC 12 warns falsely on chained std::string operator+ here.)
std::string make_id(const char* prefix, int a, int b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%d-%d", prefix, a, b);
  return buf;
}

bool wait_for(const std::function<bool()>& done) {
  const Deadline deadline = Deadline::after_ms(20000);
  while (!done()) {
    if (deadline.is_expired()) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Holds every execute() until opened, so that requests meant to be aborted cannot finish
// (by reaching max_model_len) before the test has checked duplicates and aborted them.
class GatedRunner : public ModelRunner {
 public:
  explicit GatedRunner(ModelRunner& inner) : inner_(inner) {}
  void open() { open_.store(true); }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t block_size() const override { return inner_.block_size(); }
  Status execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) override {
    while (!open_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return inner_.execute(batch, logits);
  }

 private:
  ModelRunner& inner_;
  std::atomic<bool> open_{false};
};

TEST(EngineLoopTest, ConcurrentSubmitsAndAbortsFromManyThreads) {
  FakeModelRunner fake(kVocab, 64, 4);
  GatedRunner runner(fake);
  EngineOptions o = fake_options();
  o.max_num_seqs = 6;
  EngineLoop loop(std::make_unique<Engine>(o, &runner));
  Recorder recorder;
  const int kThreads = 4;
  const int kPerThread = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = make_id("t", t, i);
        const bool to_abort = i % 3 == 0;
        // Requests to abort never finish on their own, so the id is surely still live.
        const int max_tokens = to_abort ? 1000000 : 4 + i % 9;
        Status s = loop.submit(request(id, t * 100 + i, max_tokens), recorder.callback());
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        if (to_abort) {
          EXPECT_EQ(loop.submit(request(id, 0, 1), recorder.callback()).code(),
                    StatusCode::kAlreadyExists);
          loop.abort(id);
        }
        (void)loop.stats();
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  runner.open();
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == kThreads * kPerThread; }));
  int num_aborted = 0;
  for (const auto& [id, s] : recorder.states()) {
    EXPECT_TRUE(s.finished);
    const int t = std::stoi(id.substr(1, id.find('-') - 1));
    const int i = std::stoi(id.substr(id.find('-') + 1));
    if (i % 3 == 0) {
      EXPECT_EQ(s.reason, FinishReason::kAbort) << id;
      ++num_aborted;
    } else {
      EXPECT_EQ(s.reason, FinishReason::kLength) << id;
      EXPECT_EQ(s.tokens, testing::run_alone(request(id, t * 100 + i, 4 + i % 9)).tokens) << id;
    }
  }
  EXPECT_EQ(num_aborted, kThreads * ((kPerThread + 2) / 3));
  ASSERT_TRUE(wait_for([&] { return loop.stats().num_blocks_used == 0; }));
  // A finished id may be reused.
  Recorder again;
  ASSERT_TRUE(loop.submit(request("t0-0", 1, 2), again.callback()).is_ok());
  ASSERT_TRUE(wait_for([&] { return again.num_finished() == 1; }));
}

TEST(EngineLoopTest, ShutdownWithWorkInFlightAbortsIt) {
  FakeModelRunner fake(kVocab, 64, 4);
  // The runner stays shut until shutdown has begun (submit answers Unavailable), so no request
  // can reach max_model_len first, however the threads are scheduled (was flaky under ASan).
  GatedRunner runner(fake);
  EngineLoop loop(std::make_unique<Engine>(fake_options(), &runner));
  Recorder recorder;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(loop.submit(request(make_id("r", i, 0), i, 100000), recorder.callback()).is_ok());
  }
  std::thread opener([&] {
    EXPECT_TRUE(wait_for([&] {
      return loop.submit(request("probe", 1, 1), [](const RequestOutput&) {}).code() ==
             StatusCode::kUnavailable;
    }));
    runner.open();
  });
  loop.shutdown();
  opener.join();
  EXPECT_EQ(recorder.num_finished(), 20);
  for (const auto& [id, s] : recorder.states()) {
    EXPECT_EQ(s.reason, FinishReason::kAbort) << id;
  }
  EXPECT_EQ(loop.stats().num_blocks_used, 0);
  EXPECT_EQ(loop.submit(request("late", 1, 1), recorder.callback()).code(),
            StatusCode::kUnavailable);
  loop.shutdown();  // idempotent
}

TEST(EngineLoopTest, InvalidRequestIsRefusedAtSubmit) {
  FakeModelRunner runner(kVocab, 64, 4);
  EngineLoop loop(std::make_unique<Engine>(fake_options(), &runner));
  Recorder recorder;
  EngineRequest r = request("r", 1, 1);
  r.sampling.temperature = -1;
  EXPECT_EQ(loop.submit(r, recorder.callback()).code(), StatusCode::kInvalidArgument);
  r = request("r", 1, 3);
  ASSERT_TRUE(loop.submit(r, recorder.callback()).is_ok());
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == 1; }));
  EXPECT_EQ(recorder.states()["r"].tokens.size(), 3u);
}

EngineRequest remote_prefill_request(const std::string& id, int salt, int max_tokens) {
  EngineRequest r = request(id, salt, max_tokens);
  r.kv_transfer_params.do_remote_prefill = true;
  r.kv_transfer_params.transfer_id = "xfer-" + id;
  return r;
}

struct KvLoop {
  FakeModelRunner runner{kVocab, 64, 4};
  FakeKvConnector connector;
  std::unique_ptr<EngineLoop> loop;
  explicit KvLoop(EngineLoopOptions loop_options) {
    EngineOptions o = fake_options();
    o.kv_connector = &connector;
    loop = std::make_unique<EngineLoop>(std::make_unique<Engine>(o, &runner), loop_options);
  }
  bool wait_parked(const std::string& id) {
    return wait_for([&] {
      return connector.pending_fetches().contains(id) &&
             loop->stats().num_waiting_for_remote_kv == 1;
    });
  }
};

TEST(EngineLoopTest, ConnectorEventWakesTheLoopWhichDoesNotSpinMeanwhile) {
  EngineLoopOptions lo;
  lo.kv_poll_interval_ms = 5000;  // so that only the wakeup can explain a quick resume
  KvLoop k(lo);
  ASSERT_TRUE(k.connector.wakeup() != nullptr) << "the loop must register its wakeup";
  std::atomic<int64_t> first_output_ns{0};
  Recorder recorder;
  OutputCallback record = recorder.callback();
  const EngineRequest r = remote_prefill_request("r", 5, 4);
  ASSERT_TRUE(k.loop
                  ->submit(r,
                           [&](const RequestOutput& o) {
                             int64_t zero = 0;
                             first_output_ns.compare_exchange_strong(zero, now_ns());
                             record(o);
                           })
                  .is_ok());
  ASSERT_TRUE(k.wait_parked("r"));
  const int calls_before = k.connector.num_take_events_calls();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int idle_calls = k.connector.num_take_events_calls() - calls_before;
  EXPECT_LE(idle_calls, 2) << "the loop polls the connector while it has nothing to do";

  const FakeKvConnector::Fetch f = k.connector.pending_fetches().at("r");
  k.runner.write_kv(f.prompt_token_ids, f.block_ids, 0,
                    static_cast<int64_t>(f.prompt_token_ids.size()) - 1);
  const int64_t completed_ns = now_ns();
  ASSERT_TRUE(k.connector.complete_fetch("r"));
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == 1; }));
  const double wake_ms = static_cast<double>(first_output_ns.load() - completed_ns) / 1e6;
  std::printf("connector event -> first token: %.3f ms; take_events calls in 300 ms idle: %d\n",
              wake_ms, idle_calls);
  EXPECT_LT(wake_ms, 250) << "the loop slept through the connector's wakeup";
  EngineRequest plain = r;
  plain.kv_transfer_params = {};
  EXPECT_EQ(recorder.states()["r"].tokens, testing::run_alone(plain).tokens);
  EXPECT_EQ(recorder.states()["r"].reason, FinishReason::kLength);
  EXPECT_EQ(k.runner.num_tokens_computed(), 1 + 3);
}

TEST(EngineLoopTest, ShutdownGivesUpOnAConnectorThatNeverReports) {
  EngineLoopOptions lo;
  lo.shutdown_kv_wait_ms = 300;
  KvLoop k(lo);
  Recorder recorder;
  ASSERT_TRUE(k.loop->submit(remote_prefill_request("r", 6, 4), recorder.callback()).is_ok());
  ASSERT_TRUE(k.wait_parked("r"));
  const Deadline hang = Deadline::after_ms(10000);
  k.loop->shutdown();
  EXPECT_FALSE(hang.is_expired()) << "shutdown hung on the connector";
  EXPECT_EQ(recorder.num_finished(), 1);
  EXPECT_EQ(recorder.states()["r"].reason, FinishReason::kAbort);
  EXPECT_EQ(k.connector.cancels(), std::vector<std::string>{"r"});
  EXPECT_EQ(k.loop->stats().num_blocks_used, 0);
  EXPECT_EQ(k.loop->stats().num_blocks_held_for_remote, 0);
  std::function<void()> wakeup = k.connector.wakeup();
  k.loop.reset();
  wakeup();  // a connector thread calling after the loop is gone: a no-op, not a crash
}

TEST(EngineLoopTest, ShutdownWaitsForTheConnectorToGiveBlocksBack) {
  EngineLoopOptions lo;
  lo.shutdown_kv_wait_ms = 20000;
  KvLoop k(lo);
  k.connector.set_report_on_cancel(true);  // reports the cancelled fetch at once
  Recorder recorder;
  ASSERT_TRUE(k.loop->submit(remote_prefill_request("r", 7, 4), recorder.callback()).is_ok());
  ASSERT_TRUE(k.wait_parked("r"));
  const Deadline quick = Deadline::after_ms(5000);
  k.loop->shutdown();
  EXPECT_FALSE(quick.is_expired()) << "shutdown waited for its timeout, not for the report";
  EXPECT_EQ(recorder.states()["r"].reason, FinishReason::kAbort);
  EXPECT_EQ(k.loop->stats().num_blocks_used, 0);
}

TEST(EngineLoopTest, HeldBlocksAreReleasedByTheConnectorThroughTheLoop) {
  EngineLoopOptions lo;
  lo.shutdown_kv_wait_ms = 200;
  KvLoop k(lo);
  Recorder recorder;
  EngineRequest r = request("p", 8, 1);
  r.kv_transfer_params.do_remote_decode = true;
  ASSERT_TRUE(k.loop->submit(r, recorder.callback()).is_ok());
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == 1; }));
  ASSERT_TRUE(wait_for([&] { return k.loop->stats().num_blocks_held_for_remote > 0; }));
  ASSERT_TRUE(k.connector.release_hold("p"));
  ASSERT_TRUE(wait_for([&] { return k.loop->stats().num_blocks_used == 0; }));
  // A second one stays held at shutdown: given up after the wait, and cancelled.
  r.request_id = "q";
  ASSERT_TRUE(k.loop->submit(r, recorder.callback()).is_ok());
  ASSERT_TRUE(wait_for([&] { return k.connector.pending_holds().contains("q"); }));
  k.loop->shutdown();
  EXPECT_EQ(k.connector.cancels(), std::vector<std::string>{"q"});
  EXPECT_EQ(k.loop->stats().num_blocks_used, 0);
}

}  // namespace
}  // namespace crescent::engine
