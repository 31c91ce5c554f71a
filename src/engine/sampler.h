#pragma once
// Sampler: picks one token from one row of logits under SamplingParams (logit_bias and masked
// tokens, then greedy, temperature, min_p, top_k, top_p, in vLLM's order) and computes logprobs.
// Rng is the per-request random state, so a seeded request draws the same numbers whatever else is
// batched with it. A Sampler keeps scratch buffers: use one per thread.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace crescent::engine {

// xoshiro256** seeded through splitmix64: small, fast and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  double next_double();  // uniform in [0, 1)

 private:
  uint64_t s_[4];
};

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  TokenLogprob sampled;           // the chosen token
  std::vector<TokenLogprob> top;  // the N most likely tokens, most likely first
};

class Sampler {
 public:
  // Returns the chosen token id. Advances rng once unless the params are greedy. Fills
  // *logprobs when params.logprobs is set and logprobs != nullptr (from the logits as given).
  // masked_token_ids may not be chosen (min_tokens holds back EOS and stop tokens this way)
  // unless every token is masked. A non-empty allowed_token_ids (guided decoding) is the only
  // set that may be chosen from (masked ones removed unless that empties it).
  int32_t sample(std::span<const float> logits, const SamplingParams& params, Rng& rng,
                 TokenLogprobs* logprobs, std::span<const int32_t> masked_token_ids = {},
                 std::span<const int32_t> allowed_token_ids = {});

 private:
  // adjusted_ with every token outside allowed_token_ids at -inf.
  std::span<const float> restrict_to(std::span<const float> logits, const SamplingParams& params,
                                     std::span<const int32_t> masked_token_ids,
                                     std::span<const int32_t> allowed_token_ids);
  int32_t sample_random(std::span<const float> logits, const SamplingParams& params, Rng& rng);
  // vocab_weights_ = exp((logit - max_logit) * scale) for every token, 0 for a NaN logit or one
  // below `threshold`, and chunk_sums_ of them; returns their sum (0 when nothing has weight).
  double weigh_vocab(std::span<const float> logits, float scale, float max_logit, float threshold);
  // Draws from every token by its weight in vocab_weights_ (zeros never drawn); `total` is
  // their sum.
  int32_t draw_from_vocab(double total, Rng& rng);
  void fill_logprobs(std::span<const float> logits, int32_t chosen, int num_top,
                     TokenLogprobs* out);

  std::vector<float> adjusted_;  // the logits with logit_bias and the mask applied
  std::vector<int32_t> candidates_;
  std::vector<double> weights_;
  // Without top_k: exp((logit - max) / T) of every token (0 below min_p), by the kernels'
  // vector exp, and sums of kDrawChunk consecutive weights, to find a draw without a scan of
  // the whole vocabulary.
  std::vector<float> vocab_weights_;
  std::vector<double> chunk_sums_;
  static constexpr int32_t kDrawChunk = 1024;
};

}  // namespace crescent::engine
