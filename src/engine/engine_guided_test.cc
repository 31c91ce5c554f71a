// Guided decoding through the engine: whatever the (pseudo-random) logits, the output is a
// value of the request's grammar and ends with EOS once it is complete.

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace crescent::engine {
namespace {

using testing::FakeModelRunner;

// Every printable ASCII byte (as byte-level vocabularies have), some JSON pieces, and last
// EOS (no bytes).
std::vector<std::string> json_pieces() {
  std::vector<std::string> pieces;
  for (char c = ' '; c <= '~'; ++c) {
    pieces.emplace_back(1, c);
  }
  for (const char* p :
       {"{",      "}",     "[",    "]",  "\"",    ":",  ",",     " ",   "\"name\"", "\"age",
        "\": ",   "a",     "b",    "ab", "1",     "2",  "0",     "-",   ".",        "e",
        "true",   "false", "null", "tr", "ue",    "\\", "n",     "\"}", "\n",       "x",
        "\"tags", "\":[",  "],",   "12", "\"yes", "no", "maybe", "y",   "es"}) {
    pieces.emplace_back(p);
  }
  pieces.emplace_back();
  return pieces;
}

struct Output {
  std::string text;
  FinishReason reason = FinishReason::kNone;
};

std::vector<Output> run_guided(const GuidedDecoding& guided, int num_requests) {
  const std::vector<std::string> pieces = json_pieces();
  const int vocab = static_cast<int>(pieces.size());
  const int32_t eos = vocab - 1;
  FakeModelRunner runner(vocab, 1024, 4);
  EngineOptions o;
  o.block_size = 4;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.eos_token_ids = {eos};
  o.token_bytes = pieces;
  Engine engine(o, &runner);
  for (int i = 0; i < num_requests; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = {i % (vocab - 1), (i * 7) % (vocab - 1), 3};
    r.sampling.temperature = 1.0f;
    r.sampling.seed = static_cast<uint64_t>(i);
    r.sampling.max_tokens = 400;
    r.sampling.guided = guided;
    EXPECT_TRUE(engine.add_request(std::move(r)).is_ok());
  }
  std::vector<Output> out(num_requests);
  for (int step = 0; step < 10000 && engine.has_unfinished_requests(); ++step) {
    auto outputs = engine.step();
    EXPECT_TRUE(outputs.is_ok());
    for (const RequestOutput& ro : *outputs) {
      Output& o = out[std::stoi(ro.request_id)];
      for (int32_t t : ro.new_token_ids) {
        o.text += pieces[t];
      }
      if (ro.finished) {
        o.reason = ro.finish_reason;
      }
    }
  }
  return out;
}

TEST(EngineGuidedTest, SchemaOutputParsesAndValidates) {
  GuidedDecoding g;
  g.kind = GuidedDecoding::Kind::kJsonSchema;
  g.json_schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
      "required": ["name", "age"]})";
  const std::vector<Output> outputs = run_guided(g, 50);
  for (const Output& o : outputs) {
    EXPECT_EQ(o.reason, FinishReason::kStop) << o.text;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(o.text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << o.text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << o.text;
    const std::string name = j["name"].get<std::string>();
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xC0) != 0x80; }),
              5)
        << o.text;  // code points
    ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << o.text;
    EXPECT_LE(j.size(), 3u) << o.text;
    if (j.contains("tags")) {
      ASSERT_TRUE(j["tags"].is_array()) << o.text;
      EXPECT_LE(j["tags"].size(), 3u) << o.text;
      for (const auto& t : j["tags"]) {
        EXPECT_TRUE(t.is_boolean()) << o.text;
      }
    }
  }
}

TEST(EngineGuidedTest, ChoiceOutputIsOneOfTheChoices) {
  GuidedDecoding g;
  g.kind = GuidedDecoding::Kind::kChoice;
  g.choices = {"yes", "no", "maybe"};
  for (const Output& o : run_guided(g, 20)) {
    EXPECT_EQ(o.reason, FinishReason::kStop) << o.text;
    EXPECT_TRUE(o.text == "yes" || o.text == "no" || o.text == "maybe") << o.text;
  }
}

TEST(EngineGuidedTest, RefusedWithoutTokenBytesOrWithABadSchema) {
  FakeModelRunner runner(testing::kVocab, 64, 4);
  Engine engine(testing::fake_options(), &runner);
  EngineRequest r;
  r.request_id = "r";
  r.prompt_token_ids = {1, 2};
  r.sampling.guided.kind = GuidedDecoding::Kind::kJsonObject;
  Status s = engine.add_request(r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token bytes"), std::string::npos) << s.to_string();
  r.sampling.guided.kind = GuidedDecoding::Kind::kJsonSchema;
  r.sampling.guided.json_schema = R"({"type": "string", "format": "date"})";
  s = engine.add_request(r);
  EXPECT_NE(s.message().find("'format'"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace crescent::engine
