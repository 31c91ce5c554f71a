#include "bench/dataset.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string_view>
#include <thread>

#include "core/base64.h"
#include "media/encode.h"

namespace crescent::bench {

namespace {

using json = nlohmann::json;

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// The tokenizer's text ids (PromptTokenizer::text_token_ids), refused when there are none.
Result<std::vector<int32_t>> allowed_ids_of(const PromptTokenizer& tokenizer) {
  ASSIGN_OR_RETURN(std::vector<int32_t> allowed, tokenizer.text_token_ids());
  if (allowed.empty()) {
    return invalid_argument("the tokenizer has no non-special tokens to make prompts from");
  }
  return allowed;
}

// n ids drawn uniformly from `allowed`.
std::vector<int32_t> random_ids(std::mt19937_64& rng, const std::vector<int32_t>& allowed,
                                int64_t n) {
  std::vector<int32_t> ids;
  for (int64_t k = 0; k < n; ++k) {
    ids.push_back(
        allowed[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(allowed.size()) - 1))]);
  }
  return ids;
}

// Decodes ids to text and re-encodes it until the text is exactly `target` tokens long (ids
// that merge or split across the round trip change the count), trimming or topping up with
// allowed ids; after 10 rounds the last text is kept with whatever count it has.
Result<SampleRequest> decode_to_target_len(const PromptTokenizer& tokenizer,
                                           std::vector<int32_t> ids, size_t target,
                                           const std::vector<int32_t>& allowed,
                                           std::mt19937_64& rng) {
  SampleRequest out;
  for (int rounds_left = 10;; --rounds_left) {
    ASSIGN_OR_RETURN(out.prompt, tokenizer.decode(ids));
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

Result<std::vector<SampleRequest>> sample_random(const PromptTokenizer& tokenizer,
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
  if (options.num_prefixes < 1) {
    return invalid_argument("--random-num-prefixes must be >= 1, got " +
                            std::to_string(options.num_prefixes));
  }
  if (options.prefix_len + input_low < 1) {
    return invalid_argument(
        "--random-input-len is too small: with " + std::to_string(num_special) +
        " special token(s) added by the tokenizer and --random-range-ratio " + std::to_string(r) +
        " a prompt could have no tokens; raise --random-input-len or --random-prefix-len");
  }

  ASSIGN_OR_RETURN(const std::vector<int32_t> allowed, allowed_ids_of(tokenizer));
  auto num_allowed = static_cast<int64_t>(allowed.size());

  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> prefix = random_ids(rng, allowed, options.prefix_len);
  std::vector<int64_t> input_lens, output_lens, offsets;
  for (int64_t i = 0; i < num_requests; ++i) {
    input_lens.push_back(uniform(rng, input_low, input_high));
  }
  for (int64_t i = 0; i < num_requests; ++i) {
    output_lens.push_back(uniform(rng, output_low, output_high));
  }
  const int64_t offset_range = tokenizer.offset_range();
  for (int64_t i = 0; i < num_requests; ++i) {
    offsets.push_back(uniform(rng, 0, offset_range - 1));
  }
  // More prefixes, and which one each prompt takes, are drawn after everything above: with
  // one prefix the prompts stay those of earlier versions for the same seed.
  std::vector<std::vector<int32_t>> prefixes = {prefix};
  std::vector<size_t> prefix_of(static_cast<size_t>(num_requests), 0);
  if (options.num_prefixes > 1) {
    for (int64_t p = 1; p < options.num_prefixes; ++p) {
      prefixes.push_back(random_ids(rng, allowed, options.prefix_len));
    }
    for (size_t& p : prefix_of) {
      p = static_cast<size_t>(uniform(rng, 0, options.num_prefixes - 1));
    }
  }

  std::vector<SampleRequest> requests;
  requests.reserve(static_cast<size_t>(num_requests));
  for (int64_t i = 0; i < num_requests; ++i) {
    auto index = static_cast<size_t>(i);
    std::vector<int32_t> ids = prefixes[prefix_of[index]];
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

Result<std::vector<SampleRequest>> sample_prefix_repetition(
    const PromptTokenizer& tokenizer, int64_t num_requests,
    const PrefixRepetitionOptions& options) {
  if (options.prefix_len < 0 || options.suffix_len < 0 ||
      options.prefix_len + options.suffix_len < 1) {
    return invalid_argument(
        "--prefix-repetition-prefix-len and --prefix-repetition-suffix-len must be >= 0 and not "
        "both 0");
  }
  if (options.output_len < 1) {
    return invalid_argument("--prefix-repetition-output-len must be >= 1, got " +
                            std::to_string(options.output_len));
  }
  if (options.num_prefixes < 1 || num_requests < options.num_prefixes) {
    return invalid_argument("--prefix-repetition-num-prefixes must be in [1, --num-prompts (" +
                            std::to_string(num_requests) + ")], got " +
                            std::to_string(options.num_prefixes));
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> allowed, allowed_ids_of(tokenizer));
  std::mt19937_64 rng(options.seed);
  const int64_t per_prefix = num_requests / options.num_prefixes;
  const auto target = static_cast<size_t>(options.prefix_len + options.suffix_len);
  std::vector<SampleRequest> requests;
  for (int64_t p = 0; p < options.num_prefixes; ++p) {
    const std::vector<int32_t> prefix = random_ids(rng, allowed, options.prefix_len);
    for (int64_t i = 0; i < per_prefix; ++i) {
      std::vector<int32_t> ids = prefix;
      std::vector<int32_t> suffix = random_ids(rng, allowed, options.suffix_len);
      ids.insert(ids.end(), suffix.begin(), suffix.end());
      ASSIGN_OR_RETURN(SampleRequest request,
                       decode_to_target_len(tokenizer, std::move(ids), target, allowed, rng));
      request.expected_output_len = options.output_len;
      requests.push_back(std::move(request));
    }
  }
  std::shuffle(requests.begin(), requests.end(), rng);
  return requests;
}

Result<std::vector<SampleRequest>> sample_sharegpt(const PromptTokenizer& tokenizer,
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
    auto prompt_ids = tokenizer.encode(prompt, /*add_special_tokens=*/true);
    auto answer_ids = tokenizer.encode(answer, /*add_special_tokens=*/true);
    for (const Status& s : {prompt_ids.status(), answer_ids.status()}) {
      if (!s.is_ok() && s.code() != StatusCode::kInvalidArgument) {
        return s;  // e.g. the server that tokenizes went away
      }
    }
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
      SampleRequest sample;
      sample.prompt = prompt;
      sample.prompt_len = prompt_len;
      sample.expected_output_len = output_len;
      samples.push_back(std::move(sample));
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

// ---- random-mm ----

namespace {

constexpr std::string_view kBucketFlag = "--random-mm-bucket-config";
// crescent serve's default --max-image-pixels; larger images would be refused anyway.
constexpr int64_t kMaxBucketPixels = 50'000'000;

// A cursor over the Python dict literal of --random-mm-bucket-config.
class BucketConfigParser {
 public:
  explicit BucketConfigParser(std::string_view text) : text_(text) {}

  Result<std::vector<std::pair<std::array<int64_t, 3>, double>>> parse_dict() {
    std::vector<std::pair<std::array<int64_t, 3>, double>> entries;
    if (!eat('{')) {
      return error("expected a dict such as {(256, 256, 1): 0.5, (720, 1280, 1): 0.5}");
    }
    while (!eat('}')) {
      ASSIGN_OR_RETURN(auto key, parse_key());
      if (!eat(':')) {
        return error("expected ':' after the key");
      }
      ASSIGN_OR_RETURN(std::string token, number_token());
      ASSIGN_OR_RETURN(double value, to_double(token));
      // Python's dict: a repeated key keeps its place and takes the last value.
      auto same = std::find_if(entries.begin(), entries.end(),
                               [&](const auto& e) { return e.first == key; });
      if (same != entries.end()) {
        same->second = value;
      } else {
        entries.emplace_back(key, value);
      }
      if (!eat(',')) {
        if (!eat('}')) {
          return error("expected ',' or '}'");
        }
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) {
      return error("unexpected text after the closing '}'");
    }
    return entries;
  }

  // A whole text that is one key, for quoted keys.
  Result<std::array<int64_t, 3>> parse_key_only() {
    ASSIGN_OR_RETURN(auto key, parse_tuple());
    skip_space();
    if (pos_ != text_.size()) {
      return error("unexpected text after the tuple");
    }
    return key;
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])) != 0) {
      ++pos_;
    }
  }

  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Status error(const std::string& what) const {
    std::string where =
        pos_ < text_.size() ? "at '" + std::string(text_.substr(pos_, 20)) + "'" : "at the end";
    return invalid_argument(std::string(kBucketFlag) + ": " + what + " (" + where + " in '" +
                            std::string(text_) + "')");
  }

  Result<std::array<int64_t, 3>> parse_key() {
    skip_space();
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      // vLLM's parser also takes a key written as a string holding the tuple.
      const char quote = text_[pos_++];
      size_t end = text_.find(quote, pos_);
      if (end == std::string_view::npos) {
        return error("unterminated quoted key");
      }
      std::string_view inner = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
      return BucketConfigParser(inner).parse_key_only();
    }
    return parse_tuple();
  }

  Result<std::array<int64_t, 3>> parse_tuple() {
    if (!eat('(')) {
      return error("expected a key (height, width, num_frames)");
    }
    std::vector<int64_t> values;
    while (!eat(')')) {
      ASSIGN_OR_RETURN(std::string token, number_token());
      ASSIGN_OR_RETURN(int64_t v, to_int(token));
      values.push_back(v);
      if (!eat(',')) {
        if (!eat(')')) {
          return error("expected ',' or ')' in the key");
        }
        break;
      }
    }
    if (values.size() != 3) {
      return error("a key is a tuple (height, width, num_frames) of 3 integers, got " +
                   std::to_string(values.size()));
    }
    return std::array<int64_t, 3>{values[0], values[1], values[2]};
  }

  // A Python number literal: an optional sign, then digits, '_', '.', and an exponent.
  Result<std::string> number_token() {
    skip_space();
    size_t start = pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      ++pos_;
    }
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      bool is_exponent_sign = (c == '+' || c == '-') && pos_ > start &&
                              (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E');
      if (std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == 'e' ||
          c == 'E' || is_exponent_sign) {
        ++pos_;
      } else {
        break;
      }
    }
    std::string token(text_.substr(start, pos_ - start));
    if (token.find_first_of("0123456789") == std::string::npos) {
      pos_ = start;
      return error("expected a number");
    }
    // Python allows '_' only between digits.
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '_' && (i == 0 || i + 1 == token.size() ||
                              std::isdigit(static_cast<unsigned char>(token[i - 1])) == 0 ||
                              std::isdigit(static_cast<unsigned char>(token[i + 1])) == 0)) {
        pos_ = start;
        return error("bad number '" + token + "'");
      }
    }
    token.erase(std::remove(token.begin(), token.end(), '_'), token.end());
    return token;
  }

  Result<int64_t> to_int(const std::string& token) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(token.c_str(), &end, 10);  // NOLINT(runtime/int)
    if (end != token.c_str() + token.size()) {
      return error("the sizes and frame count of a key must be integers, got '" + token + "'");
    }
    if (errno == ERANGE) {
      return error("'" + token + "' is out of range");
    }
    return static_cast<int64_t>(v);
  }

  Result<double> to_double(const std::string& token) {
    char* end = nullptr;
    double v = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size() || !std::isfinite(v)) {
      return error("bad probability '" + token + "'");
    }
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::string key_text(const std::array<int64_t, 3>& key) {
  char text[96];
  std::snprintf(text, sizeof(text), "(%lld, %lld, %lld)", static_cast<long long>(key[0]),
                static_cast<long long>(key[1]), static_cast<long long>(key[2]));
  return text;
}

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Result<std::vector<ImageBucket>> parse_mm_bucket_config(std::string_view text) {
  ASSIGN_OR_RETURN(auto entries, BucketConfigParser(text).parse_dict());
  std::vector<ImageBucket> buckets;
  double total = 0;
  for (const auto& [key, probability] : entries) {
    const auto [height, width, num_frames] = key;
    if (height <= 0 || width <= 0 || num_frames <= 0) {
      return invalid_argument(std::string(kBucketFlag) + ": " + key_text(key) +
                              ": height, width and num_frames must be >= 1");
    }
    if (height > kMaxBucketPixels || width > kMaxBucketPixels ||
        height * width > kMaxBucketPixels) {
      return invalid_argument(std::string(kBucketFlag) + ": " + key_text(key) + " has more than " +
                              std::to_string(kMaxBucketPixels) +
                              " pixels (crescent serve's default --max-image-pixels)");
    }
    if (probability < 0) {
      return invalid_argument(std::string(kBucketFlag) + ": the probability of " + key_text(key) +
                              " is negative; probabilities must be >= 0");
    }
    if (num_frames > 1) {
      if (probability > 0) {
        return invalid_argument(
            std::string(kBucketFlag) + ": " + key_text(key) + " is a video bucket (num_frames " +
            std::to_string(num_frames) +
            " > 1): crescent bench serve sends images only; give num_frames 1, or probability 0");
      }
      continue;  // a video bucket that is never drawn, as in vLLM's default
    }
    if (probability > 0) {
      buckets.push_back({static_cast<int>(height), static_cast<int>(width), probability});
      total += probability;
    }
  }
  if (buckets.empty()) {
    return invalid_argument(std::string(kBucketFlag) +
                            ": no image bucket with a probability > 0 in '" + std::string(text) +
                            "'");
  }
  for (ImageBucket& b : buckets) {
    b.probability /= total;
  }
  return buckets;
}

Result<int64_t> parse_mm_limit_per_prompt(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return invalid_argument(
        "--random-mm-limit-mm-per-prompt must be a JSON object such as '{\"image\": 3}', got '" +
        std::string(json_text) + "'");
  }
  int64_t image_limit = -1;
  for (const auto& [modality, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return invalid_argument("--random-mm-limit-mm-per-prompt: the limit of '" + modality +
                              "' must be an integer >= 0, got " + value.dump());
    }
    if (modality == "image") {
      image_limit = value.get<int64_t>();
    }
  }
  if (image_limit < 0) {
    return invalid_argument("--random-mm-limit-mm-per-prompt has no \"image\" limit: '" +
                            std::string(json_text) + "'");
  }
  return image_limit;
}

Result<std::pair<int64_t, int64_t>> mm_items_range(const RandomMultiModalOptions& options) {
  const double r = options.num_mm_items_range_ratio;
  if (!(r >= 0 && r <= 1)) {
    return invalid_argument("--random-mm-num-mm-items-range-ratio must be in [0, 1], got " +
                            std::to_string(r));
  }
  if (options.base_items_per_request < 0) {
    return invalid_argument("--random-mm-base-items-per-request must be >= 0, got " +
                            std::to_string(options.base_items_per_request));
  }
  if (options.image_limit < 0) {
    return invalid_argument("the image limit per prompt must be >= 0");
  }
  const auto n = static_cast<double>(options.base_items_per_request);
  const int64_t max_items =
      std::min(options.image_limit, static_cast<int64_t>(std::ceil(n * (1 + r))));
  const int64_t min_items = std::max<int64_t>(0, static_cast<int64_t>(std::floor(n * (1 - r))));
  if (min_items > max_items) {
    return invalid_argument("images per request would be drawn from [" + std::to_string(min_items) +
                            ", " + std::to_string(max_items) +
                            "]: the image limit of --random-mm-limit-mm-per-prompt (" +
                            std::to_string(options.image_limit) +
                            ") is below the least count --random-mm-base-items-per-request and "
                            "--random-mm-num-mm-items-range-ratio allow");
  }
  return std::pair{min_items, max_items};
}

Result<std::vector<std::vector<std::pair<int, int>>>> sample_mm_image_sizes(
    int64_t num_requests, const RandomMultiModalOptions& options) {
  ASSIGN_OR_RETURN(auto range, mm_items_range(options));
  if (options.buckets.empty()) {
    return invalid_argument("random-mm needs at least one image bucket");
  }
  std::vector<double> cumulative;
  double total = 0;
  for (const ImageBucket& b : options.buckets) {
    total += b.probability;
    cumulative.push_back(total);
  }
  // A stream of its own, so the text prompts are those of the random dataset with this seed.
  std::mt19937_64 rng(options.seed ^ 0x5EED'1A6E'0000'0001ull);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<std::vector<std::pair<int, int>>> sizes(static_cast<size_t>(num_requests));
  for (auto& request : sizes) {
    const int64_t k = uniform(rng, range.first, range.second);
    for (int64_t item = 0; item < k; ++item) {
      const double u = unit(rng) * total;
      size_t b = static_cast<size_t>(std::upper_bound(cumulative.begin(), cumulative.end(), u) -
                                     cumulative.begin());
      b = std::min(b, options.buckets.size() - 1);
      request.emplace_back(options.buckets[b].height, options.buckets[b].width);
    }
  }
  return sizes;
}

media::RgbImage random_image(int width, int height, uint64_t seed) {
  media::RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  uint64_t state = seed ^ (static_cast<uint64_t>(width) << 32) ^ static_cast<uint64_t>(height);
  size_t i = 0;
  for (; i + 8 <= image.rgb.size(); i += 8) {
    uint64_t v = splitmix64(&state);
    std::memcpy(image.rgb.data() + i, &v, 8);
  }
  if (i < image.rgb.size()) {
    uint64_t v = splitmix64(&state);
    std::memcpy(image.rgb.data() + i, &v, image.rgb.size() - i);
  }
  return image;
}

Status add_random_images(std::vector<SampleRequest>* requests,
                         const RandomMultiModalOptions& options, int num_threads) {
  ASSIGN_OR_RETURN(auto sizes,
                   sample_mm_image_sizes(static_cast<int64_t>(requests->size()), options));
  struct Job {
    size_t request = 0;
    int width = 0;
    int height = 0;
  };
  std::vector<Job> jobs;
  for (size_t r = 0; r < sizes.size(); ++r) {
    for (const auto& [height, width] : sizes[r]) {
      jobs.push_back({r, width, height});
    }
  }
  std::vector<std::string> urls(jobs.size());
  const size_t num_workers =
      std::max<size_t>(1, std::min(jobs.size(), static_cast<size_t>(std::max(1, num_threads))));
  std::vector<Status> statuses(num_workers);
  auto work = [&](size_t worker) {
    media::PngEncodeOptions png;
    png.compression_level = options.png_compression_level;
    for (size_t g = worker; g < jobs.size(); g += num_workers) {
      uint64_t state = options.seed;
      const uint64_t image_seed = splitmix64(&state) ^ (g * 0xD1B54A32D192ED03ull);
      auto bytes = media::encode_png(random_image(jobs[g].width, jobs[g].height, image_seed), png);
      if (!bytes.is_ok()) {
        statuses[worker] = bytes.status();
        return;
      }
      urls[g] = "data:image/png;base64," + base64_encode(*bytes);
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 1; w < num_workers; ++w) {
    threads.emplace_back(work, w);
  }
  work(0);
  for (std::thread& t : threads) {
    t.join();
  }
  for (const Status& s : statuses) {
    RETURN_IF_ERROR(s);
  }
  for (size_t g = 0; g < jobs.size(); ++g) {
    (*requests)[jobs[g].request].image_urls.push_back(std::move(urls[g]));
  }
  return Status::ok();
}

}  // namespace crescent::bench
