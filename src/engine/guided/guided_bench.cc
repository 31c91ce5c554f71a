// Google Benchmark of guided decoding's per-step cost on a realistic vocabulary size: the
// allowed-token walk over a synthetic 150k-token byte-level vocabulary (words with and without
// a leading space, digits, punctuation, JSON pieces, multi-byte UTF-8) in typical matcher
// states, against an unconstrained sampling step on the same logits. After the benchmarks it
// prints, per state, (mask + constrained sample) / unconstrained sample.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/guided/grammar.h"
#include "engine/guided/matcher.h"
#include "engine/guided/vocab_trie.h"
#include "engine/sampler.h"

namespace crescent::engine::guided {
namespace {

constexpr int kVocab = 151936;  // Qwen2.5's

std::vector<std::string> make_vocab() {
  std::mt19937 rng(42);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) {
    v.emplace_back(1, static_cast<char>(b));
  }
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  const char* punct[] = {"{", "}",  "\":", "\": \"", "\",", "\"}", "[", "],", ".",  ",",   "(",
                         ")", "\n", "  ",  "\n\n",   "://", "_",   "-", "==", "'s", "\\n", "\\\""};
  const char* utf8[] = {"\xc3\xa9", "\xe4\xb8\xad", "\xe6\x96\x87", "\xd0\xbf", "\xe2\x80\x94"};
  while (static_cast<int>(v.size()) < kVocab - 1) {
    std::string t;
    const unsigned kind = rng() % 100;
    if (kind < 55) {
      t = (rng() % 2 == 0) ? " " : "";
      const int len = 2 + static_cast<int>(rng() % 8);
      for (int i = 0; i < len; ++i) {
        // Skewed letter frequencies, as real merges are.
        t.push_back(letters[std::min<unsigned>(rng() % 26, rng() % 26)]);
      }
      if (rng() % 4 == 0) {
        t[t[0] == ' ' ? 1 : 0] = static_cast<char>(std::toupper(t[t[0] == ' ' ? 1 : 0]));
      }
    } else if (kind < 65) {
      const int len = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < len; ++i) {
        t.push_back(static_cast<char>('0' + rng() % 10));
      }
    } else if (kind < 80) {
      t = punct[rng() % std::size(punct)];
      t += letters.substr(rng() % 20, rng() % 5);
    } else {
      const int len = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < len; ++i) {
        t += utf8[rng() % std::size(utf8)];
      }
    }
    v.push_back(std::move(t));
  }
  v.emplace_back();  // EOS
  return v;
}

struct Fixture {
  std::vector<std::string> vocab = make_vocab();
  VocabTrie trie{vocab};
  std::vector<float> logits;
  std::shared_ptr<const Grammar> grammar;
  Fixture() {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0, 3);
    for (int i = 0; i < kVocab; ++i) {
      logits.push_back(d(rng));
    }
    grammar = *compile_json_schema(R"({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]})");
  }
  // The matcher after `prefix`: a named state of the benchmark.
  Matcher state(const std::string& prefix) const {
    Matcher m(grammar);
    if (!m.advance(prefix)) {
      std::abort();
    }
    return m;
  }
};

Fixture& fixture() {
  static Fixture* f = new Fixture();
  return *f;
}

const std::pair<const char*, const char*> kStates[] = {
    {"object_start", ""},
    {"key", "{\"na"},
    {"in_string", "{\"name\": \"Jo"},
    {"in_number", "{\"name\": \"Jo\", \"age\": 4"},
    {"array_item", "{\"name\": \"Jo\", \"tags\": [\"a\", "},
};

void BM_UnconstrainedSample(benchmark::State& st) {
  Fixture& f = fixture();
  Sampler sampler;
  SamplingParams p;
  p.temperature = st.range(0) == 0 ? 0.0f : 1.0f;
  Rng rng(3);
  for (auto _ : st) {
    benchmark::DoNotOptimize(sampler.sample(f.logits, p, rng, nullptr));
  }
}
BENCHMARK(BM_UnconstrainedSample)->Arg(0)->Arg(1);

void BM_AllowedTokens(benchmark::State& st) {
  Fixture& f = fixture();
  const Matcher m = f.state(kStates[st.range(0)].second);
  std::vector<int32_t> allowed;
  for (auto _ : st) {
    f.trie.allowed_tokens(m, &allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
  st.SetLabel(std::string(kStates[st.range(0)].first) +
              " allowed=" + std::to_string(allowed.size()));
}
BENCHMARK(BM_AllowedTokens)->DenseRange(0, std::size(kStates) - 1);

void BM_ConstrainedStep(benchmark::State& st) {
  Fixture& f = fixture();
  const Matcher m = f.state(kStates[st.range(0)].second);
  std::vector<int32_t> allowed;
  Sampler sampler;
  SamplingParams p;
  p.temperature = 1.0f;
  Rng rng(3);
  for (auto _ : st) {
    f.trie.allowed_tokens(m, &allowed);
    benchmark::DoNotOptimize(sampler.sample(f.logits, p, rng, nullptr, {}, allowed));
  }
  st.SetLabel(kStates[st.range(0)].first);
}
BENCHMARK(BM_ConstrainedStep)->DenseRange(0, std::size(kStates) - 1);

// guided_regex: a restrictive pattern (a date) and the worst case, a pattern that allows almost
// every token (no string fast path: the walk visits the whole trie).
const std::pair<const char*, const char*> kRegexes[] = {
    {"date", "\\d{4}-\\d{2}-\\d{2}"},
    {"any_text", "[^\\n]{0,200}"},
};

void BM_AllowedTokensRegex(benchmark::State& st) {
  Fixture& f = fixture();
  const Matcher m(*compile_regex_text(kRegexes[st.range(0)].second));
  std::vector<int32_t> allowed;
  for (auto _ : st) {
    f.trie.allowed_tokens(m, &allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
  st.SetLabel(std::string(kRegexes[st.range(0)].first) +
              " allowed=" + std::to_string(allowed.size()));
}
BENCHMARK(BM_AllowedTokensRegex)->DenseRange(0, std::size(kRegexes) - 1);

template <typename F>
double seconds_per_call(F&& f) {
  const int kCalls = 50;
  f();  // warm
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    f();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kCalls;
}

void print_ratios() {
  Fixture& f = fixture();
  Sampler sampler;
  SamplingParams p;
  p.temperature = 1.0f;
  Rng rng(3);
  const double base = seconds_per_call([&] { sampler.sample(f.logits, p, rng, nullptr); });
  std::printf("\nvocab %d tokens, trie %zu nodes; unconstrained sample (T=1): %.1f us\n", kVocab,
              f.trie.num_nodes(), base * 1e6);
  for (const auto& [name, prefix] : kStates) {
    const Matcher m = f.state(prefix);
    std::vector<int32_t> allowed;
    const double guided = seconds_per_call([&] {
      f.trie.allowed_tokens(m, &allowed);
      sampler.sample(f.logits, p, rng, nullptr, {}, allowed);
    });
    std::printf("  %-12s allowed %6zu  mask+sample %8.1f us  ratio %.2fx\n", name, allowed.size(),
                guided * 1e6, guided / base);
  }
}

}  // namespace
}  // namespace crescent::engine::guided

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  crescent::engine::guided::print_ratios();
  return 0;
}
