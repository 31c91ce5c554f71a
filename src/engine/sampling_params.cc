#include "engine/sampling_params.h"

#include <cmath>
#include <sstream>

#include "engine/guided/grammar.h"

namespace crescent::engine {
namespace {

template <typename T>
Status bad(const char* what, T got) {
  std::ostringstream os;
  os << what << ", got " << got;
  return invalid_argument(os.str());
}

}  // namespace

Status validate(const SamplingParams& p, int vocab_size) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return bad("temperature must be >= 0", p.temperature);
  }
  if (p.top_k < -1) {
    return bad("top_k must be -1 (off), 0 (off) or positive", p.top_k);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return bad("top_p must be in (0, 1]", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return bad("min_p must be in [0, 1]", p.min_p);
  }
  if (p.max_tokens < 1) {
    return bad("max_tokens must be at least 1", p.max_tokens);
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    std::ostringstream os;
    os << "min_tokens must be in [0, max_tokens = " << p.max_tokens << "], got " << p.min_tokens;
    return invalid_argument(os.str());
  }
  if (p.logprobs.has_value() && (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs)) {
    std::ostringstream os;
    os << "logprobs must be in [0, " << kMaxLogprobs << "], got " << *p.logprobs;
    return invalid_argument(os.str());
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) {
      return invalid_argument("stop strings must not be empty");
    }
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      std::ostringstream os;
      os << "stop_token_ids entry " << id << " is outside the vocabulary [0, " << vocab_size << ")";
      return invalid_argument(os.str());
    }
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [id, bias] = p.logit_bias[i];
    if (id < 0 || id >= vocab_size) {
      std::ostringstream os;
      os << "logit_bias token id " << id << " is outside the vocabulary [0, " << vocab_size << ")";
      return invalid_argument(os.str());
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return bad("logit_bias values must be in [-100, 100]", bias);
    }
    if (i > 0 && p.logit_bias[i - 1].first >= id) {
      return invalid_argument("logit_bias must be ordered by token id, each id once");
    }
  }
  if (p.guided.is_active()) {
    RETURN_IF_ERROR(guided::compile(p.guided).status());
  }
  return Status::ok();
}

}  // namespace crescent::engine
