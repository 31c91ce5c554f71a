#pragma once
// Helpers shared by the engine tests: a fake vocabulary with text, and running an engine to
// completion while collecting each request's outputs and checking invariants after every step.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/fake_model_runner_test_util.h"

namespace crescent::engine::testing {

inline constexpr int kVocab = 48;
inline constexpr int32_t kEos = 47;

// 0..25 letters, 26..35 digits, 36 space, 37 a held piece ("é" arrives with the next token),
// 38..46 two-letter pieces, 47 the special end-of-sequence token.
inline std::vector<std::string> fake_pieces() {
  std::vector<std::string> p;
  for (char c = 'a'; c <= 'z'; ++c) {
    p.emplace_back(1, c);
  }
  for (char c = '0'; c <= '9'; ++c) {
    p.emplace_back(1, c);
  }
  p.push_back(" ");
  p.push_back("~\xc3\xa9");
  for (const char* s : {"ab", "bc", "cd", "de", "ef", "fg", "gh", "hi", "ij"}) {
    p.push_back(s);
  }
  p.push_back("<eos>");
  return p;
}

inline int32_t tok(char c) {
  return c == ' ' ? 36 : c - 'a';
}
inline std::vector<int32_t> toks(const std::string& s) {
  std::vector<int32_t> v;
  for (char c : s) {
    v.push_back(tok(c));
  }
  return v;
}

inline EngineOptions fake_options(int block_size = 4) {
  EngineOptions o;
  o.block_size = block_size;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.eos_token_ids = {kEos};
  o.make_detokenizer = [](bool skip_special) {
    return std::make_unique<FakeDetokenizer>(fake_pieces(), kEos, skip_special);
  };
  return o;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::string> text_per_output;
  std::vector<TokenLogprobs> logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string stop_reason;
  int32_t stop_token_id = -1;
  int num_cached_tokens = 0;
  int num_outputs = 0;
  std::string error;
};

inline void collect(const std::vector<RequestOutput>& outputs,
                    std::map<std::string, Collected>& into) {
  for (const RequestOutput& o : outputs) {
    Collected& c = into[o.request_id];
    EXPECT_FALSE(c.finished) << "output after the final one for " << o.request_id;
    c.tokens.insert(c.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    c.text += o.new_text;
    c.text_per_output.push_back(o.new_text);
    c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    c.finished = o.finished;
    c.reason = o.finish_reason;
    c.stop_reason = o.stop_reason;
    c.stop_token_id = o.stop_token_id;
    c.num_cached_tokens = o.num_cached_tokens;
    c.error = o.error_message;
    ++c.num_outputs;
    EXPECT_EQ(o.num_output_tokens, static_cast<int>(c.tokens.size()));
  }
}

// Steps until nothing is left, checking the engine's invariants after every step.
inline std::map<std::string, Collected> run_all(Engine& engine, int max_steps = 100000) {
  std::map<std::string, Collected> out;
  for (int i = 0; i < max_steps && engine.has_unfinished_requests(); ++i) {
    Result<std::vector<RequestOutput>> r = engine.step();
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) {
      break;
    }
    collect(*r, out);
    Status inv = engine.check_invariants();
    EXPECT_TRUE(inv.is_ok()) << inv.to_string();
    if (!inv.is_ok()) {
      break;
    }
  }
  EXPECT_FALSE(engine.has_unfinished_requests());
  return out;
}

// What the request produces alone, on a roomy engine without prefix caching or chunking.
inline Collected run_alone(const EngineRequest& request, int block_size = 4,
                           int max_model_len = 0) {
  FakeModelRunner runner(kVocab, 512, block_size);
  EngineOptions o = fake_options(block_size);
  o.enable_prefix_caching = false;
  o.max_num_batched_tokens = 4096;
  o.max_model_len = max_model_len;
  Engine engine(o, &runner);
  Status s = engine.add_request(request);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return run_all(engine)[request.request_id];
}

}  // namespace crescent::engine::testing
