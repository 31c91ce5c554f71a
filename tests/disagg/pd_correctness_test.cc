// Disaggregated serving gives the same greedy output as one colocated server: for each KV
// transport (shm, tcp, ucx), a real prefill + decode pair behind the real proxy answers 50
// varied prompts (1 to a few hundred tokens, token-id and text prompts, shared prefixes,
// prompts sent twice so the decode engine already holds their prefix; completions and chat,
// whole and streamed; 8 at a time) token for token and logprob for logprob as
// `crescent serve --role both` does, and afterwards neither side holds a KV block.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "transfer/transfer_engine.h"

namespace crescent::testing {
namespace {

struct Case {
  std::string path;
  json body;
  std::string what;  // for failure messages
};

// A deterministic pseudo-random word sequence (same words on every run).
std::string words(uint32_t seed, int count) {
  static const char* const kWords[] = {
      "river",  "stone",   "quiet",   "engine", "paper",  "orange", "window", "seven",
      "garden", "silver",  "cloud",   "market", "yellow", "bridge", "music",  "north",
      "candle", "thunder", "pocket",  "forest", "mirror", "hollow", "signal", "copper",
      "winter", "harbor",  "lantern", "velvet", "orbit",  "meadow", "cobalt", "puzzle"};
  constexpr uint32_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::string out;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    out += (i ? " " : "") + std::string(kWords[(x >> 16) % kNumWords]);
  }
  return out;
}

std::vector<int> token_ids(uint32_t seed, int count) {
  std::vector<int> ids;
  uint32_t x = seed * 747796405u + 2891336453u;
  for (int i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(100 + static_cast<int>((x >> 8) % 20000));
  }
  return ids;
}

// Mode i % 4: completions whole, completions streamed, chat whole, chat streamed.
Case make_case(int i, const json& prompt, int max_tokens, const std::string& what) {
  bool chat = (i % 4) >= 2 && prompt.is_string();
  bool stream = (i % 2) == 1;
  Case c;
  c.what = "#" + std::to_string(i) + " " + what + (chat ? " chat" : " completions") +
           (stream ? " streamed" : " whole") + " max_tokens " + std::to_string(max_tokens);
  c.body = {{"model", kModelName}, {"temperature", 0}, {"ignore_eos", true}};
  if (chat) {
    c.path = "/v1/chat/completions";
    c.body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
    c.body["logprobs"] = true;
    c.body["top_logprobs"] = 2;
    // The proxy must cut both names to 1 for the prefill request.
    c.body[(i % 8) == 2 ? "max_completion_tokens" : "max_tokens"] = max_tokens;
  } else {
    c.path = "/v1/completions";
    c.body["prompt"] = prompt;
    c.body["logprobs"] = 2;
    c.body["max_tokens"] = max_tokens;
  }
  if (stream) {
    c.body["stream"] = true;
    c.body["stream_options"] = {{"include_usage", true}};
  }
  return c;
}

// 50 cases at full scale: varied lengths around block boundaries (16 tokens), token-id
// prompts of exact lengths, a shared prefix, and repeats of earlier prompts (in another mode)
// last, when the decode engine holds their prefix.
int num_repeated_cases(int num_cases) {
  return std::max(1, num_cases / 6);
}

std::vector<Case> make_cases(int num_cases) {
  const int kWordCounts[] = {1, 3, 7, 14, 15, 16, 17, 24, 31, 33, 47, 64, 90, 130, 200, 280, 340};
  const int kIdCounts[] = {1, 2, 15, 16, 17, 32, 33, 160};
  const std::string shared = words(999, 70);
  std::vector<json> prompts;
  std::vector<std::string> whats;
  int num_unique = num_cases - num_repeated_cases(num_cases);
  for (int i = 0; prompts.size() < static_cast<size_t>(num_unique); ++i) {
    switch (i % 5) {
      case 0:
      case 2: {
        int n = kWordCounts[(i * 7 + 3) % std::size(kWordCounts)];
        prompts.push_back(words(i, n));
        whats.push_back(std::to_string(n) + " words");
        break;
      }
      case 1: {
        int n = kIdCounts[(i / 5) % std::size(kIdCounts)];
        prompts.push_back(token_ids(i, n));
        whats.push_back(std::to_string(n) + " token ids");
        break;
      }
      default:
        prompts.push_back(shared + " " + words(i, 1 + i % 9));
        whats.push_back("shared 70-word prefix");
        break;
    }
  }
  // The longest prompts come back: those span several full blocks that D then holds.
  std::vector<size_t> by_length(prompts.size());
  for (size_t i = 0; i < by_length.size(); ++i) {
    by_length[i] = i;
  }
  auto approx_chars = [&](size_t i) {
    return prompts[i].is_string() ? prompts[i].get<std::string>().size() : 6 * prompts[i].size();
  };
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](size_t a, size_t b) { return approx_chars(a) > approx_chars(b); });
  for (size_t r = 0; prompts.size() < static_cast<size_t>(num_cases); ++r) {
    size_t from = by_length[r % by_length.size()];
    prompts.push_back(prompts[from]);
    whats.push_back("repeat of #" + std::to_string(from) + " (" + whats[from] + ")");
  }
  std::vector<Case> cases;
  for (int i = 0; i < num_cases; ++i) {
    int max_tokens = (i % 7 == 0) ? 1 : 2 + (i * 5) % 19;
    cases.push_back(make_case(i, prompts[i], max_tokens, whats[i]));
  }
  return cases;
}

// Sends every case to the server at port, num_parallel at a time; the repeats (the last
// cases) only once everything before them has finished, so their prefix is surely cached.
std::vector<Reply> run_all(int port, const std::vector<Case>& cases, int num_parallel) {
  std::vector<Reply> replies(cases.size());
  const size_t num_repeats =
      static_cast<size_t>(num_repeated_cases(static_cast<int>(cases.size())));
  for (auto [first, last] : {std::pair<size_t, size_t>{0, cases.size() - num_repeats},
                             std::pair<size_t, size_t>{cases.size() - num_repeats, cases.size()}}) {
    std::atomic<size_t> next{first};
    std::vector<std::thread> workers;
    for (int w = 0; w < num_parallel; ++w) {
      workers.emplace_back([&, last = last] {
        for (size_t i = next++; i < last; i = next++) {
          replies[i] = send(port, cases[i].path, cases[i].body);
        }
      });
    }
    for (auto& t : workers) {
      t.join();
    }
  }
  return replies;
}

// What may differ between the colocated and the disaggregated computation of one request.
// The decode engine computes the last prompt token on its own while the colocated engine
// computes it inside the prompt's batch, so BF16 rounding may move a logprob slightly; where
// the reference's two best tokens are that close, the pick may flip and the continuations are
// no longer comparable. Anything else (a different token with a clear margin, a different
// text, count or logprob) is a mismatch. Measured: the rounding differences stay near 1e-3;
// a decode engine that receives one wrong block (of a prompt's last block) shows 1e-2..4e-2.
constexpr double kLogprobTolerance = 5e-3;
constexpr double kNearTie = 2 * kLogprobTolerance;

struct Comparison {
  std::string why;  // empty: equal
  bool diverged_at_near_tie = false;
  double max_logprob_diff = 0;
};

Comparison compare(const Reply& got, const Reply& want) {
  Comparison out;
  if (!got.is_ok()) {
    out.why = "the disaggregated request failed";
    return out;
  }
  for (const char* field : {"prompt_tokens", "completion_tokens"}) {
    if (got.usage_of(field) != want.usage_of(field)) {
      out.why = std::string("usage.") + field + " differs";
      return out;
    }
  }
  if (got.tokens.size() != want.tokens.size() || want.margins.size() != want.tokens.size()) {
    out.why = "different numbers of sampled tokens or top logprobs";
    return out;
  }
  for (size_t t = 0; t < want.tokens.size(); ++t) {
    if (got.tokens[t] != want.tokens[t]) {
      if (want.margins[t] < kNearTie) {
        out.diverged_at_near_tie = true;
        return out;
      }
      out.why = "token " + std::to_string(t) + " differs ('" + got.tokens[t] + "' vs '" +
                want.tokens[t] + "') although the reference's margin is " +
                std::to_string(want.margins[t]);
      return out;
    }
    double diff = std::fabs(got.logprobs[t] - want.logprobs[t]);
    out.max_logprob_diff = std::max(out.max_logprob_diff, diff);
    if (diff > kLogprobTolerance) {
      out.why = "logprob of token " + std::to_string(t) + " differs by " + std::to_string(diff);
      return out;
    }
  }
  if (got.text != want.text) {
    out.why = "same tokens but different text";
  }
  return out;
}

// Every finished transfer of one role, by result label.
double transfers(const std::map<std::string, double>& m, const std::string& role,
                 const std::string& result) {
  return metric_sum(m, "crescent_kv_transfer_transfers_total",
                    {"role=\"" + role + "\"", "result=\"" + result + "\""});
}

class PdCorrectnessTest : public ::testing::TestWithParam<std::string> {};

// P + D of `preset` behind the proxy over `transport` answer num_cases cases as one colocated
// server does, every server started with extra_args (e.g. a --kv-cache-dtype).
void expect_pd_equals_colocated(const std::string& transport, const std::string& preset,
                                const std::vector<std::string>& extra_args, int num_cases) {
  auto kind = transfer::parse_transport(transport);
  ASSERT_TRUE(kind.is_ok());
  // The colocated reference loads while P and D do.
  ServeSpec both;
  both.model_preset = preset;
  both.extra_args = extra_args;
  auto ref = launch_serve("ref", both);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  ServeSpec spec;
  spec.transport = transport;
  spec.model_preset = preset;
  spec.extra_args = extra_args;
  spec.kv_transfer_timeout_s = 20;  // generous: correctness, not faults, is tested here
  auto pd = start_pd(spec, spec, /*with_proxy=*/true);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  ASSERT_TRUE(wait_ready(&*ref).is_ok()) << ref->output();

  const std::vector<Case> cases = make_cases(num_cases);
  std::vector<Reply> want = run_all(ref->port, cases, 8);
  std::vector<Reply> got = run_all(pd->proxy.port, cases, 8);

  int num_mismatches = 0;
  int num_near_ties = 0;
  double max_diff = 0;
  for (size_t i = 0; i < cases.size() && num_mismatches < 5; ++i) {
    const Case& c = cases[i];
    ASSERT_TRUE(want[i].is_ok()) << c.what << " reference: " << want[i].describe();
    // Logprobs were asked for: one sampled token and logprob per output token.
    ASSERT_EQ(static_cast<int>(want[i].tokens.size()), want[i].usage_of("completion_tokens"))
        << c.what << " reference: " << want[i].describe();
    Comparison cmp = compare(got[i], want[i]);
    max_diff = std::max(max_diff, cmp.max_logprob_diff);
    num_near_ties += cmp.diverged_at_near_tie ? 1 : 0;
    if (!cmp.why.empty()) {
      ++num_mismatches;
      ADD_FAILURE() << c.what << ": " << cmp.why << "\n  disaggregated: " << got[i].describe()
                    << "\n  colocated:     " << want[i].describe();
    }
  }
  // A near tie is rare; many of them would hide a real difference.
  EXPECT_LE(num_near_ties, std::max<int>(2, static_cast<int>(cases.size()) / 10));
  if (num_mismatches > 0) {
    std::string out = pd->outputs();
    ADD_FAILURE() << "process output (last 6000 bytes):\n"
                  << (out.size() > 6000 ? out.substr(out.size() - 6000) : out);
  }

  // Nothing held on either side once idle.
  EXPECT_EQ(wait_blocks_used(pd->prefill.port, 0, Deadline::after_ms(15'000)), 0) << pd->outputs();
  EXPECT_EQ(wait_blocks_used(pd->decode.port, 0, Deadline::after_ms(15'000)), 0) << pd->outputs();
  // The KV really moved (the decode engine did not quietly prefill on its own), and no
  // transfer failed.
  auto pm = read_metrics(pd->prefill.port);
  auto dm = read_metrics(pd->decode.port);
  EXPECT_GT(transfers(dm, "decode", "ok"), 0) << "no successful fetch counted on D";
  EXPECT_GT(transfers(pm, "prefill", "ok"), 0) << "no successful write counted on P";
  // The repeated and shared-prefix prompts found their prefix in D's own cache (D then asks P
  // only for the blocks after it).
  EXPECT_GT(metric_sum(dm, "crescent_prefix_cache_hits_total"), 0);
  EXPECT_EQ(transfers(dm, "decode", "error"), 0);
  EXPECT_EQ(transfers(pm, "prefill", "error"), 0);
  EXPECT_EQ(transfers(pm, "prefill", "expired"), 0);
  EXPECT_EQ(transfers(dm, "decode", "expired"), 0);
  std::string problems = pd->stop_all();
  EXPECT_TRUE(problems.empty()) << problems;
  std::printf("largest logprob difference %.2g, %d near-tie divergences\n", max_diff,
              num_near_ties);
  std::printf("%zu requests; D fetched %.0f times (%.0f bytes), P wrote %.0f times\n", cases.size(),
              transfers(dm, "decode", "ok"),
              metric_sum(dm, "crescent_kv_transfer_bytes_total", {"role=\"decode\""}),
              transfers(pm, "prefill", "ok"));
}

TEST_P(PdCorrectnessTest, ProxiedGreedyOutputEqualsColocated) {
  // tiny-llama, not tiny: tiny's greedy output merely repeats the last prompt token whatever
  // came before it, so it would hide a wrong KV; tiny-llama's output depends on the context.
  std::string preset = "tiny-llama";
  if (const char* m = std::getenv("CRESCENT_PD_MODEL"); m != nullptr && *m != '\0') {
    preset = m;
  }
  expect_pd_equals_colocated(GetParam(), preset, {}, scaled(50, 8));
}

// A q8_0 KV cache on both sides: P moves its stored blocks (34 bytes per 32 values) and D
// attends over them exactly as a colocated q8_0 server does. `small` (head_dim 32): q8_0 needs
// head_dim to be a multiple of 32.
TEST(PdKvDtypeTest, Q8_0CacheProxiedGreedyOutputEqualsColocatedQ8_0) {
  expect_pd_equals_colocated("tcp", "small", {"--kv-cache-dtype", "q8_0"}, scaled(16, 8));
}

INSTANTIATE_TEST_SUITE_P(Transports, PdCorrectnessTest,
                         ::testing::ValuesIn(transfer::available_transport_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace crescent::testing
