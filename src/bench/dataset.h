#pragma once
// Benchmark prompts, made as `vllm bench serve` makes them.
//
// random: for request i, a shared prefix of --random-prefix-len random token ids, then
// input_len ids allowed[(offset_i + i + k) % |allowed|] (allowed = the vocabulary without its
// special tokens and without the tokens that are not text on their own, such as byte-fallback
// pieces: crescent's one departure from vLLM, which keeps prompt lengths exact on such
// vocabularies), decoded to text; the text is re-encoded and the ids trimmed or topped up
// (up to 10 rounds) so the prompt's token count matches. input_len is uniform in
// [floor(L*(1-r)), ceil(L*(1+r))] with L = --random-input-len minus the special tokens the
// tokenizer adds (a BOS); output lengths likewise around --random-output-len, at least 1.
//
// sharegpt: a JSON list of {"conversations": [{"value": prompt}, {"value": answer}, ...]};
// shuffled with the seed; the first turn is the prompt and the answer's token count (or
// --sharegpt-output-len) the output length; pairs with a prompt under 4 or over 1024 tokens,
// an output under 4 (unless the length is fixed) or more than 2048 tokens in all are skipped;
// too few samples are topped up by drawing again from those kept.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"

namespace crescent::bench {

struct SampleRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // tokens, without special tokens the server may add
  int64_t expected_output_len = 0;
};

struct RandomDatasetOptions {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0;  // in [0, 1)
  int64_t prefix_len = 0;
  uint64_t seed = 0;
};

Result<std::vector<SampleRequest>> sample_random(const model::Tokenizer& tokenizer,
                                                 int64_t num_requests,
                                                 const RandomDatasetOptions& options);

struct ShareGptOptions {
  int64_t output_len = -1;  // -1: the dataset answer's token count
  uint64_t seed = 0;
};

// json_text: the whole dataset file.
Result<std::vector<SampleRequest>> sample_sharegpt(const model::Tokenizer& tokenizer,
                                                   std::string_view json_text, int64_t num_requests,
                                                   const ShareGptOptions& options);

}  // namespace crescent::bench
