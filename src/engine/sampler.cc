#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kernels/ops.h"

namespace crescent::engine {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Ordering of candidates: larger logit first, lower token id on ties, so every choice is
// deterministic. NaN counts as -inf.
float sort_key(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
}

struct ByLogitDesc {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    float la = sort_key(logits[a]);
    float lb = sort_key(logits[b]);
    return la > lb || (la == lb && a < b);
  }
};

// The largest logit, NaN ignored (-inf when there is none), with the ISA's vector max.
float max_of(std::span<const float> x) {
  return kernels::max_value(x.data(), static_cast<int64_t>(x.size()));
}

// The first index of the largest logit, NaN ignored (the last index when every logit is NaN).
int32_t argmax(std::span<const float> logits) {
  const float best = max_of(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == best) {
      return static_cast<int32_t>(i);
    }
  }
  return static_cast<int32_t>(logits.size()) - 1;
}

// Replaces NaN and negative weights with 0 in w[0, n) and returns their sum, in sixteen
// independent float lanes (vectorised; fine for n up to a few thousand terms in [0, 1]).
float clamp_and_sum(float* w, size_t n) {
  constexpr size_t kLanes = 16;
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = w[i + j] > 0.0f ? w[i + j] : 0.0f;
      w[i + j] = v;
      acc[j] += v;
    }
  }
  for (; i < n; ++i) {
    w[i] = w[i] > 0.0f ? w[i] : 0.0f;
    acc[0] += w[i];
  }
  float sum = 0.0f;
  for (float a : acc) {
    sum += a;
  }
  return sum;
}

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) {
    s = splitmix64(x);
  }
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::next_double() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& params, Rng& rng,
                        TokenLogprobs* logprobs, std::span<const int32_t> masked_token_ids,
                        std::span<const int32_t> allowed_token_ids) {
  CRESCENT_CHECK(!logits.empty()) << "empty logits row";
  // logit_bias and the mask change what is chosen, not the logprobs reported (vLLM's
  // raw_logprobs): those come from the logits as the model gave them.
  std::span<const float> choice_logits = logits;
  if (!allowed_token_ids.empty()) {
    choice_logits = restrict_to(logits, params, masked_token_ids, allowed_token_ids);
  } else if (!params.logit_bias.empty() || !masked_token_ids.empty()) {
    const auto vocab = static_cast<int32_t>(logits.size());
    adjusted_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params.logit_bias) {
      CRESCENT_CHECK(id >= 0 && id < vocab) << "logit_bias token id " << id << " not validated";
      adjusted_[id] += bias;
    }
    for (int32_t id : masked_token_ids) {
      CRESCENT_CHECK(id >= 0 && id < vocab) << "masked token id " << id << " not validated";
      adjusted_[id] = -std::numeric_limits<float>::infinity();
    }
    choice_logits = adjusted_;
  }
  int32_t chosen =
      params.is_greedy() ? argmax(choice_logits) : sample_random(choice_logits, params, rng);
  if (logprobs != nullptr && params.logprobs.has_value()) {
    fill_logprobs(logits, chosen, *params.logprobs, logprobs);
  }
  return chosen;
}

std::span<const float> Sampler::restrict_to(std::span<const float> logits,
                                            const SamplingParams& params,
                                            std::span<const int32_t> masked_token_ids,
                                            std::span<const int32_t> allowed_token_ids) {
  const auto vocab = static_cast<int32_t>(logits.size());
  const float kNegInf = -std::numeric_limits<float>::infinity();
  adjusted_.assign(logits.size(), kNegInf);
  for (int32_t id : allowed_token_ids) {
    CRESCENT_CHECK(id >= 0 && id < vocab) << "allowed token id " << id << " outside the vocab";
    adjusted_[id] = logits[id];
  }
  for (const auto& [id, bias] : params.logit_bias) {
    adjusted_[id] += bias;
  }
  bool any_left = false;
  for (int32_t id : masked_token_ids) {
    adjusted_[id] = kNegInf;
  }
  for (int32_t id : allowed_token_ids) {
    any_left = any_left || adjusted_[id] != kNegInf;
  }
  if (!any_left) {
    // Only masked (or -inf) tokens are allowed: the constraint wins over min_tokens, and a
    // token whose logit is -inf may still be drawn when nothing else is allowed.
    for (int32_t id : allowed_token_ids) {
      adjusted_[id] = std::max(logits[id], std::numeric_limits<float>::lowest());
    }
  }
  return adjusted_;
}

int32_t Sampler::sample_random(std::span<const float> logits, const SamplingParams& params,
                               Rng& rng) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const double inv_temperature = 1.0 / params.temperature;
  const float max_logit = max_of(logits);

  // min_p keeps p_i >= min_p * p_max, i.e. logit_i >= max_logit + T * ln(min_p).
  float threshold = -std::numeric_limits<float>::infinity();
  if (params.min_p > 0.0f) {
    threshold = max_logit + params.temperature * std::log(params.min_p);
  }

  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const auto scale = static_cast<float>(inv_temperature);
  // The vector path needs a finite float shift: a row of lowest() logits (every allowed token
  // masked, restrict_to) times 1/T < 1 overflows, and takes the double path instead.
  const bool use_vector_exp = !use_top_k && std::isfinite(max_logit * scale);
  if (use_vector_exp) {
    // Every token is a candidate: weigh them all at once with the vector exp (a scalar exp
    // per token cost ~1.5 ms a row on a 152k vocabulary, more than a small model's step).
    const double total = weigh_vocab(logits, scale, max_logit, threshold);
    if (!(total > 0.0)) {
      rng.next_u64();         // the draw this row would have made: later draws stay where they were
      return argmax(logits);  // nothing finite to weigh (an infinite maximum)
    }
    if (params.top_p >= 1.0f) {
      return draw_from_vocab(total, rng);
    }
    // top_p: the candidates are the tokens with a weight; their mass is `total`.
    candidates_.clear();
    for (int32_t i = 0; i < vocab; ++i) {
      if (vocab_weights_[i] > 0.0f) {
        candidates_.push_back(i);
      }
    }
  } else if (!use_top_k) {
    candidates_.clear();
    for (int32_t i = 0; i < vocab; ++i) {
      if (logits[i] >= threshold) {
        candidates_.push_back(i);
      }
    }
  } else {
    // Candidates: the top_k best (found with nth_element, not a full sort), then min_p. Both
    // keep a head of the same order, so applying them in either order gives the same set.
    candidates_.resize(vocab);
    for (int32_t i = 0; i < vocab; ++i) {
      candidates_[i] = i;
    }
    std::nth_element(candidates_.begin(), candidates_.begin() + params.top_k, candidates_.end(),
                     ByLogitDesc{logits});
    candidates_.resize(params.top_k);
    std::erase_if(candidates_, [&](int32_t id) { return !(logits[id] >= threshold); });
  }
  CRESCENT_CHECK(!candidates_.empty()) << "no finite logits to sample from";

  auto weight_of = [&](int32_t id) {
    return use_vector_exp
               ? static_cast<double>(vocab_weights_[id])
               : std::exp((static_cast<double>(logits[id]) - max_logit) * inv_temperature);
  };

  if (params.top_p < 1.0f) {
    // Keep the most likely tokens until their mass reaches top_p of the candidates' mass.
    // Usually a few dozen tokens suffice, so sort a growing head instead of the whole list.
    double total = 0.0;
    for (int32_t id : candidates_) {
      total += weight_of(id);
    }
    const double target = params.top_p * total;
    const size_t n = candidates_.size();
    size_t head = std::min<size_t>(n, 64);
    size_t keep = n;
    while (true) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + head, candidates_.end(),
                        ByLogitDesc{logits});
      double cumulative = 0.0;
      size_t i = 0;
      for (; i < head; ++i) {
        cumulative += weight_of(candidates_[i]);
        if (cumulative >= target) {
          break;
        }
      }
      if (i < head) {
        keep = i + 1;
        break;
      }
      if (head == n) {
        break;  // rounding: the whole set is kept
      }
      head = std::min(n, head * 4);
    }
    candidates_.resize(keep);
  }

  weights_.resize(candidates_.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    weights_[i] = weight_of(candidates_[i]);
    total += weights_[i];
  }
  const double u = rng.next_double() * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cumulative += weights_[i];
    if (u < cumulative) {
      return candidates_[i];
    }
  }
  return candidates_.back();
}

double Sampler::weigh_vocab(std::span<const float> logits, float scale, float max_logit,
                            float threshold) {
  const auto vocab = static_cast<int64_t>(logits.size());
  vocab_weights_.assign(logits.begin(), logits.end());
  kernels::exp_scaled(vocab_weights_.data(), vocab, scale, max_logit * scale);
  if (threshold > -std::numeric_limits<float>::infinity()) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!(logits[i] >= threshold)) {
        vocab_weights_[i] = 0.0f;
      }
    }
  }
  chunk_sums_.assign((logits.size() + kDrawChunk - 1) / kDrawChunk, 0.0);
  double total = 0.0;
  for (size_t c = 0; c < chunk_sums_.size(); ++c) {
    const size_t begin = c * kDrawChunk;
    const size_t end = std::min<size_t>(begin + kDrawChunk, logits.size());
    // A NaN logit gets weight 0: it is never drawn.
    chunk_sums_[c] = clamp_and_sum(vocab_weights_.data() + begin, end - begin);
    total += chunk_sums_[c];
  }
  return total;
}

int32_t Sampler::draw_from_vocab(double total, Rng& rng) {
  const double u = rng.next_double() * total;
  double cumulative = 0.0;
  size_t chunk = 0;
  for (; chunk + 1 < chunk_sums_.size(); ++chunk) {
    if (u < cumulative + chunk_sums_[chunk]) {
      break;
    }
    cumulative += chunk_sums_[chunk];
  }
  const size_t begin = chunk * kDrawChunk;
  const size_t end = std::min(begin + kDrawChunk, vocab_weights_.size());
  int32_t last_drawable = -1;
  for (size_t i = begin; i < end; ++i) {
    if (vocab_weights_[i] > 0.0f) {
      cumulative += vocab_weights_[i];
      last_drawable = static_cast<int32_t>(i);
      if (u < cumulative) {
        return last_drawable;
      }
    }
  }
  if (last_drawable >= 0) {
    return last_drawable;  // rounding at the chunk's end
  }
  // Rounding past the last chunk with weight: its last token with one.
  for (size_t i = vocab_weights_.size(); i-- > 0;) {
    if (vocab_weights_[i] > 0.0f) {
      return static_cast<int32_t>(i);
    }
  }
  CRESCENT_CHECK(false) << "no token with a weight to draw";
  return 0;
}

void Sampler::fill_logprobs(std::span<const float> logits, int32_t chosen, int num_top,
                            TokenLogprobs* out) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float max_logit = max_of(logits);
  // The normaliser with the vector exp (summed in double by chunks: float lanes over 152k
  // terms would lose ~1e-5 of the accuracy logprobs report).
  const double sum = weigh_vocab(logits, 1.0f, max_logit, -std::numeric_limits<float>::infinity());
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_z); };

  out->sampled = {chosen, logprob(chosen)};
  out->top.clear();
  const int32_t n = std::min(num_top, vocab);
  if (n <= 0) {
    return;
  }
  candidates_.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    candidates_[i] = i;
  }
  std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(),
                    ByLogitDesc{logits});
  for (int32_t i = 0; i < n; ++i) {
    out->top.push_back({candidates_[i], logprob(candidates_[i])});
  }
}

}  // namespace crescent::engine
