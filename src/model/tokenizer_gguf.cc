// GGUF tokenizer metadata -> the tokenizer.json that says the same, loaded by Tokenizer. Going
// through tokenizer.json text keeps one tokenizer implementation (and its tests) for both
// sources, as transformers' GGUF loader does; the text is built and parsed once at load (about
// 0.3 s for a 152k-token vocabulary, most of it the parse that tokenizer.json costs anyway).

#include "model/tokenizer_gguf.h"

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "model/pretokenizer.h"

namespace crescent::model {
namespace {

using Json = nlohmann::json;

// llama.cpp's llama_token_type values (tokenizer.ggml.token_type).
constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;
constexpr int64_t kTokenUnused = 5;

struct PreTokenizerFamily {
  std::string_view name;  // tokenizer.ggml.pre
  SplitPattern pattern;
  bool nfc;             // tokenizer.json's normalizer is NFC (Qwen2)
  bool ignore_merges;   // a piece that is a whole vocabulary entry skips BPE (Llama-3)
  bool bos_by_default;  // llama.cpp adds BOS when add_bos_token is absent
};

// "default" is what llama.cpp's converter writes when it does not recognise a tokenizer; GPT-2's
// regex is the byte-level BPE baseline (llama.cpp's own "default" splitting differs slightly).
constexpr std::array<PreTokenizerFamily, 7> kFamilies = {{
    {"qwen2", SplitPattern::kQwen2, true, false, false},
    {"llama3", SplitPattern::kLlama3, false, true, true},
    {"llama-v3", SplitPattern::kLlama3, false, true, true},
    {"llama-bpe", SplitPattern::kLlama3, false, true, true},
    {"gpt2", SplitPattern::kGpt2, false, false, false},
    {"gpt-2", SplitPattern::kGpt2, false, false, false},
    {"default", SplitPattern::kGpt2, false, false, false},
}};

Result<const PreTokenizerFamily*> find_family(const std::string& path, const std::string& pre) {
  std::string known;
  for (const PreTokenizerFamily& f : kFamilies) {
    if (f.name == pre)
      return &f;
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  return unimplemented(path + ": tokenizer.ggml.pre '" + pre +
                       "' is not a pre-tokenizer crescent knows (known: " + known +
                       "); put the model's tokenizer.json beside the .gguf");
}

Result<std::optional<int64_t>> optional_id(const GgufFile& gguf, const std::string& key,
                                           size_t num_tokens) {
  if (!gguf.has_key(key))
    return std::optional<int64_t>();
  ASSIGN_OR_RETURN(int64_t id, gguf.get_int(key));
  if (id < 0 || static_cast<size_t>(id) >= num_tokens) {
    return invalid_argument(gguf.path() + ": " + key + " " + std::to_string(id) +
                            " is outside the vocabulary of " + std::to_string(num_tokens));
  }
  return std::optional<int64_t>(id);
}

Result<bool> optional_bool(const GgufFile& gguf, const std::string& key, bool def) {
  if (!gguf.has_key(key))
    return def;
  return gguf.get_bool(key);
}

// The whole tokenizer.json, plus the parts of tokenizer_config.json the engine reads.
struct Converted {
  std::string json;
  TokenizerConfig config;
};

Result<Converted> convert(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  if (!gguf.has_key("tokenizer.ggml.model")) {
    return not_found(path + " has no tokenizer (no tokenizer.ggml.model key): put the model's " +
                     "tokenizer.json beside it");
  }
  ASSIGN_OR_RETURN(std::string model, gguf.get_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return unimplemented(path + ": tokenizer.ggml.model '" + model +
                         "' is not supported (only 'gpt2', byte-level BPE" +
                         (model == "llama" ? "; 'llama' is SentencePiece" : "") +
                         "); put the model's tokenizer.json beside the .gguf");
  }
  std::string pre = "default";
  if (gguf.has_key("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre, gguf.get_string("tokenizer.ggml.pre"));
  }
  ASSIGN_OR_RETURN(const PreTokenizerFamily* family, find_family(path, pre));

  ASSIGN_OR_RETURN(std::vector<std::string> tokens, gguf.get_string_array("tokenizer.ggml.tokens"));
  std::vector<int64_t> types(tokens.size(), 1);
  if (gguf.has_key("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, gguf.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return invalid_argument(path + ": tokenizer.ggml.token_type has " +
                              std::to_string(types.size()) + " entries for " +
                              std::to_string(tokens.size()) + " tokens");
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> merges, gguf.get_string_array("tokenizer.ggml.merges"));

  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kTokenUnused)
      continue;
    if (types[id] == kTokenControl || types[id] == kTokenUserDefined) {
      added.push_back({{"id", id},
                       {"content", tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[id] == kTokenControl}});
    } else {
      vocab[tokens[id]] = id;
    }
  }
  Json merge_pairs = Json::array();
  for (const std::string& m : merges) {
    // As llama.cpp splits them: at the first space after the first byte.
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) {
      return invalid_argument(path + ": malformed tokenizer.ggml.merges entry '" + m + "'");
    }
    merge_pairs.push_back(Json::array({m.substr(0, space), m.substr(space + 1)}));
  }

  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = family->nfc ? Json{{"type", "NFC"}} : Json(nullptr);
  if (family->pattern == SplitPattern::kGpt2) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", true},
                          {"use_regex", true}};
  } else {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         Json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", std::string(split_pattern_regex(family->pattern))}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", false},
                       {"use_regex", false}}})}};
  }

  Converted out;
  ASSIGN_OR_RETURN(std::optional<int64_t> bos,
                   optional_id(gguf, "tokenizer.ggml.bos_token_id", tokens.size()));
  ASSIGN_OR_RETURN(std::optional<int64_t> eos,
                   optional_id(gguf, "tokenizer.ggml.eos_token_id", tokens.size()));
  ASSIGN_OR_RETURN(std::optional<int64_t> pad,
                   optional_id(gguf, "tokenizer.ggml.padding_token_id", tokens.size()));
  ASSIGN_OR_RETURN(bool add_bos,
                   optional_bool(gguf, "tokenizer.ggml.add_bos_token", family->bos_by_default));
  ASSIGN_OR_RETURN(bool add_eos, optional_bool(gguf, "tokenizer.ggml.add_eos_token", false));
  Json single = Json::array();
  Json special_tokens = Json::object();
  auto add_special = [&](int64_t id) {
    const std::string& name = tokens[static_cast<size_t>(id)];
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    special_tokens[name] = {
        {"id", name}, {"ids", Json::array({id})}, {"tokens", Json::array({name})}};
  };
  if (add_bos && bos)
    add_special(*bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos && eos)
    add_special(*eos);
  if (special_tokens.empty()) {
    j["post_processor"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  } else {
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", std::move(single)},
                           {"special_tokens", std::move(special_tokens)}};
  }
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", family->ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merge_pairs)}};
  try {
    out.json = j.dump();
  } catch (const Json::exception& e) {
    return invalid_argument(path + ": tokenizer metadata is not valid UTF-8: " + e.what());
  }

  auto token_text = [&](const std::optional<int64_t>& id) -> std::optional<std::string> {
    if (!id)
      return std::nullopt;
    return tokens[static_cast<size_t>(*id)];
  };
  out.config.bos_token = token_text(bos);
  out.config.eos_token = token_text(eos);
  out.config.pad_token = token_text(pad);
  if (gguf.has_key("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(out.config.chat_template, gguf.get_string("tokenizer.chat_template"));
  }
  return out;
}

}  // namespace

bool gguf_has_tokenizer(const GgufFile& gguf) {
  return gguf.has_key("tokenizer.ggml.model") || gguf.has_key("tokenizer.ggml.tokens");
}

Result<std::string> gguf_tokenizer_json(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(Converted c, convert(gguf));
  return std::move(c.json);
}

Result<GgufTokenizer> tokenizer_from_gguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(Converted c, convert(gguf));
  GgufTokenizer out;
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::from_json(c.json);
  if (!tokenizer.is_ok())
    return tokenizer.status().with_context(gguf.path() + " (tokenizer.ggml.*)");
  out.tokenizer = std::move(tokenizer).value();
  out.config = std::move(c.config);
  return out;
}

}  // namespace crescent::model
