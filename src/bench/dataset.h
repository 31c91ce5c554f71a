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
//
// random-mm (vLLM's RandomMultiModalDataset, images only): the random prompts above, each with
// k images, k uniform in [max(0, floor(n*(1-r))), min(limit, ceil(n*(1+r)))] (n: base items
// per request, r: range ratio, limit: the image limit per prompt); each image's (height, width)
// drawn from the bucket probabilities; pixels uniform random bytes, sent as PNG data URLs.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/prompt_tokenizer.h"
#include "core/status.h"
#include "media/image.h"

namespace crescent::bench {

struct SampleRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // tokens, without special tokens the server may add
  int64_t expected_output_len = 0;
  // random-mm: the request's images as data URLs ("data:image/png;base64,..."), sent as chat
  // image_url parts after the text.
  std::vector<std::string> image_urls;
};

struct RandomDatasetOptions {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0;  // in [0, 1)
  int64_t prefix_len = 0;
  // Different random prefixes of prefix_len tokens; each prompt starts with one picked at
  // random (a prefix-repetition workload, as vLLM's prefix_repetition dataset). 1: one for all.
  int64_t num_prefixes = 1;
  uint64_t seed = 0;
};

Result<std::vector<SampleRequest>> sample_random(const PromptTokenizer& tokenizer,
                                                 int64_t num_requests,
                                                 const RandomDatasetOptions& options);

// vLLM's prefix_repetition dataset: num_prefixes random prefixes of prefix_len tokens, each
// followed by num_requests / num_prefixes random suffixes of suffix_len tokens (so up to
// num_prefixes - 1 fewer requests than asked, as vLLM), shuffled; every output output_len.
struct PrefixRepetitionOptions {
  int64_t prefix_len = 256;
  int64_t suffix_len = 256;
  int64_t num_prefixes = 10;
  int64_t output_len = 128;
  uint64_t seed = 0;
};

Result<std::vector<SampleRequest>> sample_prefix_repetition(const PromptTokenizer& tokenizer,
                                                            int64_t num_requests,
                                                            const PrefixRepetitionOptions& options);

struct ShareGptOptions {
  int64_t output_len = -1;  // -1: the dataset answer's token count
  uint64_t seed = 0;
};

// json_text: the whole dataset file.
Result<std::vector<SampleRequest>> sample_sharegpt(const PromptTokenizer& tokenizer,
                                                   std::string_view json_text, int64_t num_requests,
                                                   const ShareGptOptions& options);

// One --random-mm-bucket-config entry: an image size and its probability.
struct ImageBucket {
  int height = 0;
  int width = 0;
  double probability = 0;
};

struct RandomMultiModalOptions {
  int64_t base_items_per_request = 1;   // n
  double num_mm_items_range_ratio = 0;  // r, in [0, 1]
  int64_t image_limit = 255;            // vLLM's default {"image": 255}
  // Normalized (probabilities > 0, summing to 1), as parse_mm_bucket_config returns them.
  // vLLM's default: {(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}.
  std::vector<ImageBucket> buckets = {{256, 256, 0.5}, {720, 1280, 0.5}};
  uint64_t seed = 0;
  int png_compression_level = 1;  // random pixels do not compress; level 1 is the fastest
};

// vLLM's --random-mm-bucket-config: a Python dict literal whose keys are (height, width,
// num_frames) tuples, e.g. "{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}". Keys may also be quoted
// ("'(256, 256, 1)'", as vLLM's parser accepts), integers may have '_' separators, a trailing
// comma is allowed and a repeated key keeps its first position with the last value (Python's
// dict). Zero-probability entries are dropped and the rest scaled to sum to 1. InvalidArgument
// for a malformed text, a side <= 0, num_frames < 1, a negative probability, all zero, or a
// video bucket (num_frames > 1) with a probability > 0: only images are sent.
Result<std::vector<ImageBucket>> parse_mm_bucket_config(std::string_view text);

// vLLM's --random-mm-limit-mm-per-prompt, a JSON object such as {"image": 3, "video": 0}: the
// image limit. InvalidArgument for bad JSON, a negative or non-integer value, or no "image".
Result<int64_t> parse_mm_limit_per_prompt(std::string_view json_text);

// The [min, max] image count per request, as vLLM computes it; InvalidArgument for r outside
// [0, 1], a negative n, or min > max.
Result<std::pair<int64_t, int64_t>> mm_items_range(const RandomMultiModalOptions& options);

// The image sizes ({height, width}) of each of num_requests requests; deterministic in the seed.
Result<std::vector<std::vector<std::pair<int, int>>>> sample_mm_image_sizes(
    int64_t num_requests, const RandomMultiModalOptions& options);

// Uniform random RGB bytes, deterministic in (width, height, seed).
media::RgbImage random_image(int width, int height, uint64_t seed);

// Adds the random-mm images to requests (sample_mm_image_sizes, random pixels per image, PNG,
// data URL), encoding on up to num_threads threads; the result does not depend on the count.
Status add_random_images(std::vector<SampleRequest>* requests,
                         const RandomMultiModalOptions& options, int num_threads);

}  // namespace crescent::bench
