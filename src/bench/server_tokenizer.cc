#include "bench/server_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "model/unicode.h"
#include "net/http/http_client.h"

namespace crescent::bench {

namespace {

using json = nlohmann::json;

enum class Dialect { kVllm, kLlamaCpp };

class ServerTokenizer final : public PromptTokenizer {
 public:
  explicit ServerTokenizer(ServerTokenizerOptions options)
      : options_(std::move(options)), client_(options_.address.host, options_.address.port) {
    options_.headers["content-type"] = "application/json";
  }

  // Tries vLLM's shape, then llama.cpp's.
  Status probe() {
    const std::string text = "Hello world";
    dialect_ = Dialect::kVllm;
    auto vllm = encode(text, false);
    if (vllm.is_ok() && !vllm->empty()) {
      return harvest_text_ids();
    }
    dialect_ = Dialect::kLlamaCpp;
    auto llama = encode(text, false);
    if (llama.is_ok() && !llama->empty()) {
      return harvest_text_ids();
    }
    return failed_precondition("cannot tokenize through " + options_.address.url() +
                               "/tokenize (neither vLLM's nor llama.cpp server's shape answered: " +
                               vllm.status().message() +
                               "); pass --tokenizer DIR|FILE with the served model's "
                               "tokenizer.json or .gguf");
  }

  Result<std::vector<int32_t>> encode(std::string_view text,
                                      bool add_special_tokens) const override {
    if (!model::unicode::is_valid_utf8(text)) {
      return invalid_argument("text to tokenize is not valid UTF-8");
    }
    json body = dialect_ == Dialect::kVllm
                    ? json{{"model", options_.model},
                           {"prompt", text},
                           {"add_special_tokens", add_special_tokens}}
                    : json{{"content", text}, {"add_special", add_special_tokens}};
    ASSIGN_OR_RETURN(json reply, post("/tokenize", body));
    if (!reply.contains("tokens") || !reply["tokens"].is_array()) {
      return unavailable("POST " + options_.address.url() +
                         "/tokenize answered without a "
                         "'tokens' list: " +
                         reply.dump().substr(0, 200));
    }
    std::vector<int32_t> ids;
    ids.reserve(reply["tokens"].size());
    for (const json& t : reply["tokens"]) {
      if (!t.is_number_integer()) {
        return unavailable("POST " + options_.address.url() +
                           "/tokenize answered a token that is not an integer id: " + t.dump());
      }
      ids.push_back(t.get<int32_t>());
    }
    return ids;
  }

  Result<std::string> decode(std::span<const int32_t> ids) const override {
    json tokens = std::vector<int32_t>(ids.begin(), ids.end());
    json body = dialect_ == Dialect::kVllm ? json{{"model", options_.model}, {"tokens", tokens}}
                                           : json{{"tokens", tokens}};
    ASSIGN_OR_RETURN(json reply, post("/detokenize", body));
    const char* key = dialect_ == Dialect::kVllm ? "prompt" : "content";
    if (!reply.contains(key) || !reply[key].is_string()) {
      return unavailable("POST " + options_.address.url() + "/detokenize answered without '" + key +
                         "': " + reply.dump().substr(0, 200));
    }
    return reply[key].get<std::string>();
  }

  Result<std::vector<int32_t>> text_token_ids() const override { return text_ids_; }

  [[nodiscard]] int64_t offset_range() const override {
    return static_cast<int64_t>(text_ids_.size());
  }

  [[nodiscard]] std::string source() const override { return options_.address.url() + "/tokenize"; }

 private:
  Result<json> post(const std::string& path, const json& body) const {
    const std::string url = options_.address.url() + path;
    std::lock_guard lock(mu_);
    auto response =
        client_.request("POST", options_.address.path_prefix + path, body.dump(), options_.headers,
                        Deadline::after_ms(static_cast<int64_t>(options_.timeout_s * 1000)));
    if (!response.is_ok()) {
      return response.status().with_context("POST " + url);
    }
    if (response->status != 200) {
      return unavailable("POST " + url + " answered HTTP " + std::to_string(response->status) +
                         ": " + response->body.substr(0, 300));
    }
    json reply = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
    if (!reply.is_object()) {
      return unavailable("POST " + url + " answered a body that is not a JSON object: " +
                         response->body.substr(0, 200));
    }
    return reply;
  }

  Status harvest_text_ids() {
    auto ids = encode(pseudo_word_text(), false);
    if (!ids.is_ok()) {
      return ids.status().with_context("tokenizing the built-in text random prompts draw from");
    }
    std::sort(ids->begin(), ids->end());
    ids->erase(std::unique(ids->begin(), ids->end()), ids->end());
    text_ids_ = std::move(*ids);
    return Status::ok();
  }

  ServerTokenizerOptions options_;
  std::vector<int32_t> text_ids_;  // set by probe()
  Dialect dialect_ = Dialect::kVllm;
  mutable std::mutex mu_;
  mutable net::http::HttpClient client_;  // guarded by mu_
};

}  // namespace

std::string pseudo_word_text() {
  constexpr std::string_view kConsonants = "bcdfghjklmnprstvwxyz";
  constexpr std::string_view kVowels = "aeiou";
  constexpr std::string_view kPunctuation = ",.;:?!-";
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  std::string text;
  for (int word = 0; word < 6000; ++word) {
    if (word > 0) {
      text += ' ';
    }
    if (next(12) == 0) {
      text += std::to_string(next(100000));
      continue;
    }
    const size_t start = text.size();
    for (uint64_t s = 0, n = 1 + next(4); s < n; ++s) {
      text += kConsonants[next(kConsonants.size())];
      text += kVowels[next(kVowels.size())];
      if (next(3) == 0) {
        text += kConsonants[next(kConsonants.size())];
      }
    }
    if (next(6) == 0) {
      text[start] = static_cast<char>(text[start] - 'a' + 'A');
    }
    if (next(8) == 0) {
      text += kPunctuation[next(kPunctuation.size())];
    }
  }
  return text;
}

Result<std::unique_ptr<PromptTokenizer>> connect_server_tokenizer(ServerTokenizerOptions options) {
  auto tokenizer = std::make_unique<ServerTokenizer>(std::move(options));
  RETURN_IF_ERROR(tokenizer->probe());
  return std::unique_ptr<PromptTokenizer>(std::move(tokenizer));
}

}  // namespace crescent::bench
