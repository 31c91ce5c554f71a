#pragma once
// SamplingParams: how one request turns logits into tokens and when it stops (the vLLM /
// OpenAI knobs). A plain value type; validate() checks it against a vocabulary before the
// engine accepts the request.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace crescent::engine {

// The most top logprobs a request may ask for per token (vLLM's default max_logprobs).
inline constexpr int kMaxLogprobs = 20;
// OpenAI's bound on a logit_bias value.
inline constexpr float kMaxLogitBias = 100.0f;

// Structured output: the output must be one value of a grammar (see engine/guided/). A plain
// value; the engine compiles it when the request is added.
struct GuidedDecoding {
  enum class Kind {
    kNone,
    kJsonObject,  // any JSON object (response_format json_object)
    kJsonSchema,  // json_schema: a JSON Schema subset (response_format json_schema, guided_json)
    kChoice,      // exactly one of choices, as raw text (guided_choice)
    kRegex,       // raw text matching a regular expression in full (guided_regex)
  };
  Kind kind = Kind::kNone;
  std::string json_schema;           // kJsonSchema: the schema's JSON text
  std::vector<std::string> choices;  // kChoice
  std::string regex;                 // kRegex: the pattern (engine/guided/regex.h)
  bool is_active() const { return kind != Kind::kNone; }
};

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0 or -1: off
  float top_p = 1.0f;        // in (0, 1]; 1: off
  float min_p = 0.0f;        // in [0, 1]; 0: off
  // Same seed, same logits -> same tokens, whatever else is in the batch. Absent: random.
  std::optional<uint64_t> seed;
  int32_t max_tokens = 16;
  // Stop strings: not part of the returned text unless include_stop_str_in_output.
  std::vector<std::string> stop;
  // Kept in the token ids; their text is returned only with include_stop_str_in_output.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // vLLM's: the text ends with the stop string (or stop token) that ended generation.
  bool include_stop_str_in_output = false;
  // vLLM's: until this many tokens are generated, EOS (unless ignore_eos) and stop_token_ids
  // are masked out of sampling and stop strings are not matched. At most max_tokens.
  int32_t min_tokens = 0;
  // OpenAI's: added to the token's logit before sampling (greedy included), in [-100, 100].
  // Ordered by token id, ids unique.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Absent: no logprobs. N: the sampled token's logprob plus the N most likely tokens, all from
  // the unmodified log-softmax of the logits (before logit_bias, min_tokens, temperature and
  // filters), as vLLM does.
  std::optional<int32_t> logprobs;
  bool skip_special_tokens = true;
  // Constrains every sampled token so the output stays a prefix of the grammar's values, and
  // allows EOS only once it is a complete value (and only EOS after a closed value).
  GuidedDecoding guided;

  bool is_greedy() const { return temperature == 0.0f || top_k == 1; }
};

// InvalidArgument naming the first bad field, e.g. "temperature must be >= 0, got -1". A guided
// constraint is compiled to check it (an unsupported schema keyword is named).
Status validate(const SamplingParams& params, int vocab_size);

}  // namespace crescent::engine
