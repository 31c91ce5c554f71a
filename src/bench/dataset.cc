#include "bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string_view>

namespace crescent::bench {

namespace {

using json = nlohmann::json;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Decodes ids to text and re-encodes it until the text is exactly `target` tokens long (ids
// that merge or split across the round trip change the count), trimming or topping up with
// allowed ids; after 10 rounds the last text is kept with whatever count it has.
Result<SampleRequest> decode_to_target_len(const model::Tokenizer& tokenizer,
                                           std::vector<int32_t> ids, size_t target,
                                           const std::vector<int32_t>& allowed,
                                           std::mt19937_64& rng) {
  SampleRequest out;
  for (int rounds_left = 10;; --rounds_left) {
    out.prompt = tokenizer.decode(ids);
    ASSIGN_OR_RETURN(ids, tokenizer.encode(out.prompt, /*add_special_tokens=*/false));
    if (rounds_left <= 0 || ids.size() == target) {
      break;
    }
    if (ids.size() > target) {
      ids.resize(target);
    } else {
      while (ids.size() < target) {
        ids.push_back(allowed[static_cast<size_t>(
            uniform(rng, 0, static_cast<int64_t>(allowed.size()) - 1))]);
      }
    }
  }
  out.prompt_len = static_cast<int64_t>(ids.size());
  return out;
}

}  // namespace

Result<std::vector<SampleRequest>> sample_random(const model::Tokenizer& tokenizer,
                                                 int64_t num_requests,
                                                 const RandomDatasetOptions& options) {
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return invalid_argument("--random-range-ratio must be in [0, 1), got " +
                            std::to_string(options.range_ratio));
  }
  if (options.input_len < 0 || options.output_len < 0 || options.prefix_len < 0) {
    return invalid_argument(
        "--random-input-len, --random-output-len and --random-prefix-len "
        "must be >= 0");
  }
  ASSIGN_OR_RETURN(auto bos, tokenizer.encode("", /*add_special_tokens=*/true));
  auto num_special = static_cast<int64_t>(bos.size());
  int64_t real_input_len = std::max<int64_t>(0, options.input_len - num_special);
  double r = options.range_ratio;
  auto input_low = static_cast<int64_t>(std::floor(static_cast<double>(real_input_len) * (1 - r)));
  auto input_high = static_cast<int64_t>(std::ceil(static_cast<double>(real_input_len) * (1 + r)));
  auto output_low = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(static_cast<double>(options.output_len) * (1 - r))));
  auto output_high = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(options.output_len) * (1 + r))));
  if (options.prefix_len + input_low < 1) {
    return invalid_argument(
        "--random-input-len is too small: with " + std::to_string(num_special) +
        " special token(s) added by the tokenizer and --random-range-ratio " + std::to_string(r) +
        " a prompt could have no tokens; raise --random-input-len or --random-prefix-len");
  }

  // Tokens that are not text on their own (a byte-fallback <0xE3>, half of a character in a
  // byte-level vocabulary) decode to U+FFFD next to arbitrary neighbours, which re-encodes to
  // a different number of tokens and makes the prompt's length drift: they are left out.
  std::vector<int32_t> allowed;
  int32_t vocab_size = tokenizer.vocab_size();
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (tokenizer.is_special(id) || tokenizer.id_to_token(id).empty()) {
      continue;
    }
    std::string text = tokenizer.decode(std::span<const int32_t>(&id, 1));
    if (!text.empty() && text.find(kReplacementCharacter) == std::string::npos) {
      allowed.push_back(id);
    }
  }
  if (allowed.empty()) {
    return invalid_argument("the tokenizer has no non-special tokens to make prompts from");
  }
  auto num_allowed = static_cast<int64_t>(allowed.size());

  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> prefix;
  for (int64_t k = 0; k < options.prefix_len; ++k) {
    prefix.push_back(allowed[static_cast<size_t>(uniform(rng, 0, num_allowed - 1))]);
  }
  std::vector<int64_t> input_lens, output_lens, offsets;
  for (int64_t i = 0; i < num_requests; ++i) {
    input_lens.push_back(uniform(rng, input_low, input_high));
  }
  for (int64_t i = 0; i < num_requests; ++i) {
    output_lens.push_back(uniform(rng, output_low, output_high));
  }
  for (int64_t i = 0; i < num_requests; ++i) {
    offsets.push_back(uniform(rng, 0, vocab_size - 1));
  }

  std::vector<SampleRequest> requests;
  requests.reserve(static_cast<size_t>(num_requests));
  for (int64_t i = 0; i < num_requests; ++i) {
    auto index = static_cast<size_t>(i);
    std::vector<int32_t> ids = prefix;
    for (int64_t k = 0; k < input_lens[index]; ++k) {
      ids.push_back(allowed[static_cast<size_t>((offsets[index] + i + k) % num_allowed)]);
    }
    auto target = static_cast<size_t>(options.prefix_len + input_lens[index]);
    ASSIGN_OR_RETURN(SampleRequest request,
                     decode_to_target_len(tokenizer, std::move(ids), target, allowed, rng));
    request.expected_output_len = output_lens[index];
    requests.push_back(std::move(request));
  }
  return requests;
}

Result<std::vector<SampleRequest>> sample_sharegpt(const model::Tokenizer& tokenizer,
                                                   std::string_view json_text, int64_t num_requests,
                                                   const ShareGptOptions& options) {
  json data = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (data.is_discarded()) {
    return invalid_argument("the ShareGPT dataset is not valid JSON");
  }
  if (!data.is_array()) {
    return invalid_argument("the ShareGPT dataset must be a JSON list of conversations");
  }
  // (prompt, answer) of every entry with two turns or more.
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const json& entry : data) {
    if (!entry.is_object()) {
      continue;
    }
    auto conv = entry.find("conversations");
    if (conv == entry.end() || !conv->is_array() || conv->size() < 2) {
      continue;
    }
    const json& first = (*conv)[0];
    const json& second = (*conv)[1];
    if (!first.is_object() || !second.is_object() || !first.contains("value") ||
        !second.contains("value") || !first["value"].is_string() || !second["value"].is_string()) {
      continue;
    }
    pairs.emplace_back(first["value"].get<std::string>(), second["value"].get<std::string>());
  }
  if (pairs.empty()) {
    return invalid_argument(
        "the ShareGPT dataset has no entry with a 'conversations' list of two turns or more");
  }
  std::mt19937_64 rng(options.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);

  std::vector<SampleRequest> samples;
  for (const auto& [prompt, answer] : pairs) {
    if (static_cast<int64_t>(samples.size()) >= num_requests) {
      break;
    }
    auto prompt_ids = tokenizer.encode(prompt);
    auto answer_ids = tokenizer.encode(answer);
    if (!prompt_ids.is_ok() || !answer_ids.is_ok()) {
      continue;  // not valid UTF-8
    }
    auto prompt_len = static_cast<int64_t>(prompt_ids->size());
    bool fixed_output = options.output_len >= 0;
    int64_t output_len =
        fixed_output ? options.output_len : static_cast<int64_t>(answer_ids->size());
    bool is_valid = prompt_len >= 4 && (fixed_output || output_len >= 4) && prompt_len <= 1024 &&
                    prompt_len + output_len <= 2048;
    if (is_valid) {
      samples.push_back({prompt, prompt_len, output_len});
    }
  }
  if (samples.empty()) {
    return invalid_argument(
        "no ShareGPT conversation fits the limits (prompt 4..1024 tokens, output >= 4, "
        "prompt + output <= 2048)");
  }
  // Oversample (with replacement) when the file has too few usable conversations.
  auto num_kept = static_cast<int64_t>(samples.size());
  while (static_cast<int64_t>(samples.size()) < num_requests) {
    samples.push_back(samples[static_cast<size_t>(uniform(rng, 0, num_kept - 1))]);
  }
  return samples;
}

}  // namespace crescent::bench
