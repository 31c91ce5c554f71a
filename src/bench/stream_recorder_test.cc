// How a streamed response's events become TTFT, ITL, latency, token counts or a failure.

#include "bench/stream_recorder.h"

#include <gtest/gtest.h>

namespace crescent::bench {
namespace {

RequestOutput finish(const StreamRecorder& rec) {
  RequestOutput out;
  out.prompt_len = 42;
  rec.finish(&out);
  return out;
}

TEST(StreamRecorderTest, ChatRoleChunkIsNotTheFirstToken) {
  StreamRecorder rec(/*is_chat=*/true, 0);
  rec.on_event(
      R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})",
      0.05);
  rec.on_event(R"({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]})", 0.2);
  rec.on_event(R"({"choices":[{"index":0,"delta":{},"finish_reason":null}]})", 0.25);  // no text
  rec.on_event(R"({"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]})", 0.4);
  rec.on_event(R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}})", 0.41);
  rec.on_event("[DONE]", 0.42);
  RequestOutput out = finish(rec);
  ASSERT_TRUE(out.success) << out.error;
  EXPECT_DOUBLE_EQ(out.ttft_s, 0.2);
  ASSERT_EQ(out.itl_s.size(), 2u);
  EXPECT_NEAR(out.itl_s[0], 0.05, 1e-12);  // a chunk with an empty delta still carried a token
  EXPECT_NEAR(out.itl_s[1], 0.15, 1e-12);
  EXPECT_DOUBLE_EQ(out.latency_s, 0.4);
  EXPECT_EQ(out.generated_text, "Hi!");
  EXPECT_EQ(out.output_tokens, 3);
  EXPECT_EQ(out.prompt_len, 3);
}

TEST(StreamRecorderTest, OneTokenOutput) {
  StreamRecorder rec(false, 10);
  rec.on_event(R"({"choices":[{"text":"x","finish_reason":"length"}]})", 10.25);
  rec.on_event(R"({"choices":[],"usage":{"completion_tokens":1}})", 10.26);
  rec.on_event("[DONE]", 10.27);
  RequestOutput out = finish(rec);
  ASSERT_TRUE(out.success);
  EXPECT_DOUBLE_EQ(out.ttft_s, 0.25);
  EXPECT_TRUE(out.itl_s.empty());
  EXPECT_DOUBLE_EQ(out.latency_s, 0.25);
  EXPECT_EQ(out.output_tokens, 1);
  EXPECT_EQ(out.prompt_len, 42);  // no prompt_tokens in usage: the dataset's count stays
}

TEST(StreamRecorderTest, NoUsageLeavesTokensUnknown) {
  StreamRecorder rec(false, 0);
  rec.on_event(R"({"choices":[{"text":"x"}]})", 1);
  rec.on_event("[DONE]", 1);
  RequestOutput out = finish(rec);
  ASSERT_TRUE(out.success);
  EXPECT_EQ(out.output_tokens, -1);
}

TEST(StreamRecorderTest, ErrorEventFailsWithItsMessage) {
  StreamRecorder rec(false, 0);
  rec.on_event(R"({"choices":[{"text":"x"}]})", 0.1);
  rec.on_event(R"({"error":{"message":"generation failed: KV transfer timed out","type":"x"}})",
               0.2);
  EXPECT_TRUE(rec.has_failed());
  rec.on_event("[DONE]", 0.3);
  RequestOutput out = finish(rec);
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "error event in stream: generation failed: KV transfer timed out");
}

TEST(StreamRecorderTest, StreamWithoutDoneFails) {
  StreamRecorder rec(false, 0);
  rec.on_event(R"({"choices":[{"text":"x"}]})", 0.1);
  RequestOutput out = finish(rec);
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "the stream ended before data: [DONE]");
}

TEST(StreamRecorderTest, StreamWithoutOutputFails) {
  StreamRecorder rec(true, 0);
  rec.on_event(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})", 0.1);
  rec.on_event("[DONE]", 0.2);
  RequestOutput out = finish(rec);
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "the stream ended without any output chunk");
}

TEST(StreamRecorderTest, GarbageEventFails) {
  StreamRecorder rec(false, 0);
  rec.on_event("not json", 0.1);
  RequestOutput out = finish(rec);
  EXPECT_FALSE(out.success);
  EXPECT_NE(out.error.find("not a JSON object: not json"), std::string::npos) << out.error;
}

TEST(StreamRecorderTest, EventAfterDoneFails) {
  StreamRecorder rec(false, 0);
  rec.on_event(R"({"choices":[{"text":"x"}]})", 0.1);
  rec.on_event("[DONE]", 0.2);
  rec.on_event(R"({"choices":[{"text":"y"}]})", 0.3);
  RequestOutput out = finish(rec);
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "event after data: [DONE]");
}

}  // namespace
}  // namespace crescent::bench
