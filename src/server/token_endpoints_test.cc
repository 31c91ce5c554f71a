#include "server/token_endpoints.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/kv_events.h"
#include "server/fake_engine_client.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;

// A fake engine with a KV event log of block size 2.
class LoggedFakeEngine : public FakeEngineClient {
 public:
  LoggedFakeEngine()
      : FakeEngineClient(FakeEngineClient::Options{}),
        log_(std::make_shared<engine::KvEventLog>("engine-x", 2, 16)) {}
  std::shared_ptr<const engine::KvEventLog> kv_event_log() const override { return log_; }
  engine::KvEventLog& log() { return *log_; }

 private:
  std::shared_ptr<engine::KvEventLog> log_;
};

TEST(TokenEndpointsTest, TokenizeAnswersVllmShapeAndTheBlockManagersHashes) {
  LoggedFakeEngine engine;
  EndpointReply r = tokenize_reply(engine, R"({"prompt": "a b c d e"})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_GE(j["tokens"].size(), 5u);  // and the BOS the fake adds
  EXPECT_EQ(j["count"], j["tokens"].size());
  EXPECT_EQ(j["max_model_len"], engine.max_model_len());
  EXPECT_FALSE(j.contains("block_hashes"));

  r = tokenize_reply(engine, R"({"prompt": "a b c d e", "return_block_hashes": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  std::vector<int32_t> tokens = j["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(j["block_size"], 2);
  EXPECT_EQ(j["block_hashes"].get<std::vector<uint64_t>>(), engine::prefix_block_hashes(tokens, 2));
  EXPECT_EQ(j["block_hashes"].size(), tokens.size() / 2);  // full blocks only

  // add_special_tokens either way on both shapes (generation refuses the one it does not do).
  r = tokenize_reply(engine, R"({"prompt": "a b c d e", "add_special_tokens": false})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["count"].get<size_t>() + 1, tokens.size()) << "no BOS";
  r = tokenize_reply(
      engine, R"({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": true})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = tokenize_reply(engine, R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(tokenize_reply(engine, R"({"prompt": "a", "messages": []})").status, 400);
  EXPECT_EQ(tokenize_reply(engine, R"({"prompt": "a", "return_block_hashes": 1})").status, 400);
  FakeEngineClient plain(FakeEngineClient::Options{});
  EXPECT_EQ(tokenize_reply(plain, R"({"prompt": "a", "return_block_hashes": true})").status, 501);
}

TEST(TokenEndpointsTest, DetokenizeChecksIds) {
  LoggedFakeEngine engine;
  EndpointReply r = detokenize_reply(engine, R"({"tokens": [5, 6]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["prompt"], engine.token_text(5) + engine.token_text(6));
  EXPECT_EQ(detokenize_reply(engine, R"({"tokens": [-1]})").status, 400);
  EXPECT_EQ(detokenize_reply(engine, R"({"tokens": "x"})").status, 400);
}

TEST(TokenEndpointsTest, KvEventsFollowTheLog) {
  LoggedFakeEngine engine;
  engine.log().record_stored({7, 8});
  EndpointReply r = kv_events_reply(engine, "");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["engine_id"], "engine-x");
  EXPECT_EQ(j["block_size"], 2);
  EXPECT_EQ(j["seq"], 1);
  EXPECT_FALSE(j["reset"].get<bool>());  // since=0 of the same engine: every event is kept
  ASSERT_EQ(j["events"].size(), 1u);
  EXPECT_EQ(j["events"][0]["type"], "stored");

  engine.log().record_removed(7);
  j = json::parse(kv_events_reply(engine, "since=1&engine_id=engine-x").body);
  ASSERT_EQ(j["events"].size(), 1u);
  EXPECT_EQ(j["events"][0]["type"], "removed");
  EXPECT_EQ(j["events"][0]["hashes"], json::array({7}));
  j = json::parse(kv_events_reply(engine, "since=1&engine_id=other").body);
  EXPECT_TRUE(j["reset"].get<bool>());
  EXPECT_EQ(j["events"][0]["hashes"], json::array({8}));
  EXPECT_EQ(kv_events_reply(engine, "since=abc").status, 400);
  FakeEngineClient plain(FakeEngineClient::Options{});
  EXPECT_EQ(kv_events_reply(plain, "").status, 501);
}

}  // namespace
}  // namespace crescent::server
