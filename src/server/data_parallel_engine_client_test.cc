#include "server/data_parallel_engine_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "server/fake_engine_client.h"

namespace crescent::server {
namespace {

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  void wait_for(int n) {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return finished >= n; }));
  }
  EngineClient::OutputCallback callback() {
    return [this](const GenerationOutput& out) {
      if (out.finished) {
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        cv.notify_all();
      }
    };
  }
};

engine::SamplingParams two_tokens() {
  engine::SamplingParams s;
  s.max_tokens = 2;
  return s;
}

TEST(DataParallelEngineClientTest, RoutesByRankAndRefusesAnUnknownRank) {
  FakeEngineClient a({}), b({});
  DataParallelEngineClient dp({&a, &b});
  Waiter w;
  SubmitOptions to_b;
  to_b.data_parallel_rank = 1;
  to_b.kv_transfer.transfer_id = "xfer-7";
  ASSERT_TRUE(dp.submit("r1", {1, 2, 3}, two_tokens(), to_b, w.callback()).is_ok());
  w.wait_for(1);
  EXPECT_EQ(b.last_submit_options().kv_transfer.transfer_id, "xfer-7");
  EXPECT_EQ(a.last_submit_options().kv_transfer.transfer_id, "");
  EXPECT_EQ(dp.metrics().num_generation_tokens_total,
            a.metrics().num_generation_tokens_total + b.metrics().num_generation_tokens_total);

  SubmitOptions bad;
  bad.data_parallel_rank = 2;
  Status s = dp.submit("r2", {1, 2, 3}, two_tokens(), bad, w.callback());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.message();
}

TEST(DataParallelEngineClientTest, SpreadsUnroutedRequestsAndAbortsOnTheRightRank) {
  FakeEngineClient::Options slow;
  slow.step_delay_us = 50000;  // keeps requests in flight long enough to see the spread
  FakeEngineClient a(slow), b(slow);
  DataParallelEngineClient dp({&a, &b});
  Waiter w;
  engine::SamplingParams many;
  many.max_tokens = 40;
  ASSERT_TRUE(dp.submit("x", {1, 2}, many, {}, w.callback()).is_ok());
  ASSERT_TRUE(dp.submit("y", {1, 2}, many, {}, w.callback()).is_ok());
  EXPECT_EQ(a.metrics().num_running + b.metrics().num_running, 2);
  EXPECT_EQ(a.metrics().num_running, 1);
  EXPECT_EQ(dp.submit("x", {1, 2}, many, {}, w.callback()).code(), StatusCode::kAlreadyExists);
  dp.abort("x");
  dp.abort("y");
  w.wait_for(2);
  EXPECT_EQ(dp.metrics().num_blocks_used, 0);
}

}  // namespace
}  // namespace crescent::server
