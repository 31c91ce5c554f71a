// tokenizer.json -> Tokenizer::Impl: the SAX pass over the vocabulary and merges, and the
// normalizer / pre-tokenizer / post-processor / decoder sections. Runs on one thread, before the
// tokenizer is shared.
#include <array>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace crescent::model {

using namespace tokenizer_impl;  // NOLINT(google-build-using-namespace): Impl's own types

namespace tokenizer_impl {

// The vocabulary and merges are most of an 11 MB tokenizer.json: a SAX pass stores them straight
// into vectors and builds a DOM only for the rest (model.vocab/model.merges become null there).
struct BigParts {
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // first structural problem in vocab/merges
};

}  // namespace tokenizer_impl

namespace {

using Json = nlohmann::json;

// GPT-2's reversible byte <-> printable-character mapping.
std::array<char32_t, 256> byte_to_char_table() {
  std::array<char32_t, 256> t{};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
  }
  return t;
}
std::string to_hex_byte_token(unsigned b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string s = "<0x00>";
  s[3] = kHex[b >> 4];
  s[4] = kHex[b & 15];
  return s;
}
Status unsupported(std::string_view what) {
  return unimplemented("tokenizer.json: unsupported feature: " + std::string(what));
}

std::string type_of(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) {
    return j["type"].get<std::string>();
  }
  return "";
}

bool get_bool(const Json& j, const char* key, bool def) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) {
    return def;
  }
  return j[key].get<bool>();
}
class TokenizerSax {
 public:
  TokenizerSax(Json* root, BigParts* parts) : dom_(*root, true), parts_(parts) {}

  bool null() {
    return scalar([&] { return dom_.null(); });
  }
  bool boolean(bool v) {
    return scalar([&] { return dom_.boolean(v); });
  }
  bool number_integer(Json::number_integer_t v) {
    if (mode_ == Mode::kVocab) {
      parts_->vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return scalar([&] { return dom_.number_integer(v); });
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) {
      parts_->vocab.emplace_back(std::move(key_), static_cast<int64_t>(v));
      return true;
    }
    return scalar([&] { return dom_.number_unsigned(v); });
  }
  bool number_float(Json::number_float_t v, const std::string& s) {
    return scalar([&] { return dom_.number_float(v, s); });
  }
  bool string(std::string& v) {
    if (mode_ == Mode::kMerges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
        bad("malformed merge '" + v + "'");
      } else {
        parts_->merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      }
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar([&] { return dom_.string(v); });
  }
  bool binary(Json::binary_t& v) {
    return scalar([&] { return dom_.binary(v); });
  }
  bool start_object(std::size_t n) {
    if (mode_ != Mode::kNormal) {
      bad("unexpected object in model.vocab/merges");
      ++skip_depth_;
      return true;
    }
    if (at_model_child("vocab")) {
      mode_ = Mode::kVocab;
      parts_->has_vocab = true;
      return true;
    }
    path_.push_back(key_);
    return dom_.start_object(n);
  }
  bool key(std::string& k) {
    key_ = k;
    if (mode_ != Mode::kNormal) {
      return true;
    }
    return dom_.key(k);
  }
  bool end_object() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kNormal;
      return dom_.null();
    }
    path_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kNormal) {
      bad("unexpected array in model.vocab/merges");
      ++skip_depth_;
      return true;
    }
    if (at_model_child("merges")) {
      mode_ = Mode::kMerges;
      parts_->has_merges = true;
      return true;
    }
    path_.push_back(key_);
    return dom_.start_array(n);
  }
  bool end_array() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) {
        bad("merge entry is not a pair of strings");
      } else {
        parts_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      }
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kNormal;
      return dom_.null();
    }
    path_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string& token,
                   const nlohmann::detail::exception& ex) {
    return dom_.parse_error(pos, token, ex);
  }

 private:
  enum class Mode { kNormal, kVocab, kMerges, kMergePair };
  template <typename F>
  bool scalar(F&& f) {
    if (mode_ != Mode::kNormal) {
      bad("unexpected value in model.vocab/merges");
      return true;
    }
    return f();
  }
  bool at_model_child(std::string_view k) const {
    // path_ holds the key of each open container: [""(root), "model"].
    return path_.size() == 2 && path_[1] == "model" && key_ == k;
  }
  void bad(std::string what) {
    if (parts_->error.empty()) {
      parts_->error = std::move(what);
    }
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  BigParts* parts_;
  Mode mode_ = Mode::kNormal;
  std::string key_;
  std::vector<std::string> path_;
  std::vector<std::string> pair_;
  int skip_depth_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading.

Status Tokenizer::Impl::set_token(int32_t id, const std::string& s) {
  if (id < 0) {
    return invalid_argument("tokenizer.json: negative token id for '" + s + "'");
  }
  if (static_cast<size_t>(id) >= tokens.size()) {
    tokens.resize(id + 1);
    present.resize(id + 1, 0);
  }
  tokens[id] = s;
  present[id] = 1;
  vocab[s] = id;
  return Status::ok();
}

Status Tokenizer::Impl::load(const Json& j, BigParts& parts) {
  if (!j.is_object()) {
    return invalid_argument("tokenizer.json: top level is not an object");
  }
  if (!j.contains("model") || !j["model"].is_object()) {
    return invalid_argument("tokenizer.json: missing 'model'");
  }
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    return unsupported("truncation");
  }
  RETURN_IF_ERROR(load_model(j["model"], parts));
  if (j.contains("added_tokens")) {
    RETURN_IF_ERROR(load_added(j["added_tokens"]));
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    RETURN_IF_ERROR(load_normalizer(j["normalizer"]));
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    RETURN_IF_ERROR(load_pre_tokenizer(j["pre_tokenizer"], true));
  }
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    RETURN_IF_ERROR(load_post_processor(j["post_processor"]));
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    RETURN_IF_ERROR(load_decoder(j["decoder"], true));
  }

  special.assign(tokens.size(), 0);
  for (const auto& a : added) {
    special[a.id] = a.special ? 1 : 0;
  }
  byte_value.assign(tokens.size(), -1);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& s = tokens[id];
    if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(s[3])) &&
        std::isxdigit(static_cast<unsigned char>(s[4]))) {
      byte_value[id] = static_cast<int16_t>(std::stoi(s.substr(3, 2), nullptr, 16));
    }
  }
  if (decoder == DecoderKind::kByteLevel || byte_level) {
    // Each char of a token maps back to one byte; a token with a char outside the table (an
    // added token such as "<|im_start|>" is plain ASCII and maps to itself) keeps its UTF-8.
    std::array<int16_t, 512> char_to_byte;  // the table's chars are all below U+0200
    char_to_byte.fill(-1);
    const auto table = byte_to_char_table();
    for (int b = 0; b < 256; ++b) {
      char_to_byte[table[b]] = static_cast<int16_t>(b);
    }
    token_bytes.assign(tokens.size(), std::string());
    for (size_t id = 0; id < tokens.size(); ++id) {
      const std::string& s = tokens[id];
      std::string bytes;
      bool ok = true;
      size_t pos = 0;
      while (pos < s.size()) {
        const char32_t cp = unicode::next_code_point(s, &pos);
        if (cp >= char_to_byte.size() || char_to_byte[cp] < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(char_to_byte[cp]));
      }
      token_bytes[id] = ok ? std::move(bytes) : s;
    }
    if (byte_level) {
      for (const auto& [tok, id] : vocab) {
        if (present[id] && static_cast<size_t>(id) < token_bytes.size()) {
          raw_vocab.emplace(token_bytes[id], id);
        }
      }
      for (int b = 0; b < 256; ++b) {
        std::string c;
        unicode::append_utf8(table[b], &c);
        auto it = vocab.find(c);
        if (it == vocab.end()) {
          return invalid_argument(
              "tokenizer.json: byte-level vocabulary lacks the token for byte " +
              std::to_string(b));
        }
        byte_ids[b] = it->second;
      }
    }
  }
  return Status::ok();
}

Status Tokenizer::Impl::load_model(const Json& m, BigParts& parts) {
  const std::string type = type_of(m);
  if (type != "BPE" && !(type.empty() && m.contains("merges"))) {
    return unsupported("model type '" + type + "' (only BPE is implemented)");
  }
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    return unsupported("BPE dropout");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty()) {
      return unsupported(std::string("BPE ") + key);
    }
  }
  byte_fallback = get_bool(m, "byte_fallback", false);
  ignore_merges = get_bool(m, "ignore_merges", false);
  fuse_unk = get_bool(m, "fuse_unk", false);
  if (!parts.error.empty()) {
    return invalid_argument("tokenizer.json: " + parts.error);
  }
  if (!parts.has_vocab) {
    return invalid_argument("tokenizer.json: model.vocab is not an object");
  }
  vocab.reserve(parts.vocab.size() + 1024);
  for (auto& [token, id] : parts.vocab) {
    if (id < 0 || id > (1 << 30)) {
      return invalid_argument("tokenizer.json: bad vocab id for '" + token + "'");
    }
    RETURN_IF_ERROR(set_token(static_cast<int32_t>(id), token));
  }
  parts.vocab = {};
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it == vocab.end()) {
      return invalid_argument("tokenizer.json: unk_token is not in the vocabulary");
    }
    unk_id = it->second;
  }
  if (!parts.has_merges) {
    return invalid_argument("tokenizer.json: model.merges is not an array");
  }
  merges.reserve(parts.merges.size());
  int32_t rank = 0;
  std::string both;
  for (const auto& [left, right] : parts.merges) {
    both = left + right;
    auto a = vocab.find(left), b = vocab.find(right), c = vocab.find(both);
    if (a == vocab.end() || b == vocab.end() || c == vocab.end()) {
      return invalid_argument("tokenizer.json: merge '" + left + " " + right +
                              "' uses a token that is not in the vocabulary");
    }
    merges.insert(a->second, b->second, rank, c->second);
    ++rank;
  }
  if (byte_fallback) {
    for (unsigned b = 0; b < 256; ++b) {
      auto it = vocab.find(to_hex_byte_token(b));
      byte_ids[b] = it == vocab.end() ? -1 : it->second;
    }
  }
  return Status::ok();
}

Status Tokenizer::Impl::load_added(const Json& a) {
  if (!a.is_array()) {
    return invalid_argument("tokenizer.json: added_tokens is not an array");
  }
  for (const Json& t : a) {
    if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
        !t["id"].is_number_integer() || !t["content"].is_string()) {
      return invalid_argument("tokenizer.json: malformed added token " + t.dump());
    }
    AddedToken tok;
    tok.id = t["id"].get<int32_t>();
    tok.content = t["content"].get<std::string>();
    tok.special = get_bool(t, "special", false);
    tok.lstrip = get_bool(t, "lstrip", false);
    tok.rstrip = get_bool(t, "rstrip", false);
    tok.normalized = get_bool(t, "normalized", !tok.special);
    if (get_bool(t, "single_word", false)) {
      return unsupported("added token with single_word=true ('" + tok.content + "')");
    }
    RETURN_IF_ERROR(set_token(tok.id, tok.content));
    added.push_back(std::move(tok));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    (added[i].normalized ? normalized_matcher : raw_matcher).add(added[i].content, i);
  }
  raw_matcher.finish();
  normalized_matcher.finish();
  return Status::ok();
}

Status Tokenizer::Impl::load_normalizer(const Json& n) {
  const std::string type = type_of(n);
  if (type == "Sequence") {
    if (!n.contains("normalizers") || !n["normalizers"].is_array()) {
      return invalid_argument("tokenizer.json: normalizer Sequence without 'normalizers'");
    }
    for (const Json& sub : n["normalizers"]) {
      RETURN_IF_ERROR(load_normalizer(sub));
    }
    return Status::ok();
  }
  if (type == "NFC") {
    normalizers.push_back({NormKind::kNfc, "", ""});
  } else if (type == "NFKC") {
    normalizers.push_back({NormKind::kNfkc, "", ""});
  } else if (type == "Prepend") {
    normalizers.push_back({NormKind::kPrepend, n.value("prepend", ""), ""});
  } else if (type == "Replace") {
    if (!n.contains("pattern") || !n["pattern"].contains("String")) {
      return unsupported("normalizer Replace with a regex pattern");
    }
    normalizers.push_back(
        {NormKind::kReplace, n["pattern"]["String"].get<std::string>(), n.value("content", "")});
  } else {
    return unsupported("normalizer type '" + type + "'");
  }
  return Status::ok();
}

Status Tokenizer::Impl::load_pre_tokenizer(const Json& p, bool top_level) {
  const std::string type = type_of(p);
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
      return invalid_argument("tokenizer.json: pre_tokenizer Sequence without 'pretokenizers'");
    }
    bool first = true;
    for (const Json& sub : p["pretokenizers"]) {
      RETURN_IF_ERROR(load_pre_tokenizer(sub, top_level && first));
      first = false;
    }
    return Status::ok();
  }
  if (type == "Split") {
    const std::string behavior = p.value("behavior", "");
    if (behavior != "Isolated") {
      return unsupported("Split pre-tokenizer behavior '" + behavior + "'");
    }
    if (get_bool(p, "invert", false)) {
      return unsupported("Split pre-tokenizer with invert=true");
    }
    if (!p.contains("pattern") || !p["pattern"].contains("Regex")) {
      return unsupported("Split pre-tokenizer with a non-regex pattern");
    }
    const std::string re = p["pattern"]["Regex"].get<std::string>();
    auto pattern = recognize_split_pattern(re);
    if (!pattern) {
      return unsupported("Split pre-tokenizer regex " + re);
    }
    pre_ops.push_back({PreKind::kSplit, *pattern});
    return Status::ok();
  }
  if (type == "ByteLevel") {
    if (byte_level) {
      return unsupported("more than one ByteLevel pre-tokenizer");
    }
    byte_level = true;
    if (get_bool(p, "add_prefix_space", true)) {
      if (!top_level) {
        return unsupported("ByteLevel add_prefix_space after another pre-tokenizer");
      }
      byte_level_prefix_space = true;
    }
    if (get_bool(p, "use_regex", true)) {
      pre_ops.push_back({PreKind::kSplit, SplitPattern::kGpt2});
    }
    return Status::ok();
  }
  if (type == "Metaspace") {
    if (!top_level) {
      return unsupported("Metaspace after another pre-tokenizer");
    }
    metaspace = true;
    metaspace_replacement = p.value("replacement", "\xE2\x96\x81");
    std::string scheme = p.value("prepend_scheme", "");
    if (scheme.empty()) {
      scheme = get_bool(p, "add_prefix_space", true) ? "always" : "never";
    }
    if (scheme == "always") {
      metaspace_prepend = PrependScheme::kAlways;
    } else if (scheme == "first") {
      metaspace_prepend = PrependScheme::kFirst;
    } else if (scheme == "never") {
      metaspace_prepend = PrependScheme::kNever;
    } else {
      return unsupported("Metaspace prepend_scheme '" + scheme + "'");
    }
    if (get_bool(p, "split", true)) {
      pre_ops.push_back({PreKind::kMetaspaceSplit, SplitPattern::kGpt2});
    }
    return Status::ok();
  }
  return unsupported("pre_tokenizer type '" + type + "'");
}

Status Tokenizer::Impl::load_post_processor(const Json& p) {
  const std::string type = type_of(p);
  if (type == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array()) {
      return invalid_argument("tokenizer.json: post_processor Sequence without 'processors'");
    }
    for (const Json& sub : p["processors"]) {
      RETURN_IF_ERROR(load_post_processor(sub));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    return Status::ok();  // only adjusts offsets
  }
  if (type != "TemplateProcessing") {
    return unsupported("post_processor type '" + type + "'");
  }
  if (!post_prefix.empty() || !post_suffix.empty()) {
    return unsupported("more than one TemplateProcessing post-processor");
  }
  if (!p.contains("single") || !p["single"].is_array()) {
    return invalid_argument("tokenizer.json: TemplateProcessing without 'single'");
  }
  bool seen_sequence = false;
  for (const Json& item : p["single"]) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", "") != "A" || seen_sequence) {
        return unsupported("TemplateProcessing single template other than one sequence A");
      }
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", "");
      const Json* ids = nullptr;
      if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
        ids = &p["special_tokens"][name]["ids"];
      }
      if (ids == nullptr || !ids->is_array()) {
        return invalid_argument("tokenizer.json: TemplateProcessing special token '" + name +
                                "' has no ids");
      }
      for (const Json& id : *ids) {
        (seen_sequence ? post_suffix : post_prefix).push_back(id.get<int32_t>());
      }
    } else {
      return invalid_argument("tokenizer.json: malformed TemplateProcessing item " + item.dump());
    }
  }
  return Status::ok();
}

Status Tokenizer::Impl::load_decoder(const Json& d, bool top_level) {
  const std::string type = type_of(d);
  if (type == "ByteLevel") {
    if (!top_level) {
      return unsupported("ByteLevel decoder inside a Sequence");
    }
    decoder = DecoderKind::kByteLevel;
    return Status::ok();
  }
  if (type == "Sequence" && top_level) {
    if (!d.contains("decoders") || !d["decoders"].is_array()) {
      return invalid_argument("tokenizer.json: decoder Sequence without 'decoders'");
    }
    decoder = DecoderKind::kPipeline;
    for (const Json& sub : d["decoders"]) {
      RETURN_IF_ERROR(load_decoder(sub, false));
    }
    return Status::ok();
  }
  decoder = DecoderKind::kPipeline;
  // Supported shape: [Replace|Metaspace]* ByteFallback? Fuse? Strip(after Fuse)?
  if (type == "Replace" || type == "Metaspace") {
    if (has_byte_fallback_decoder || !strip_char.empty()) {
      return unsupported("decoder " + type + " after ByteFallback/Strip");
    }
    DecodeStep step;
    if (type == "Replace") {
      if (!d.contains("pattern") || !d["pattern"].contains("String")) {
        return unsupported("decoder Replace with a regex pattern");
      }
      step.kind = StepKind::kReplace;
      step.from = d["pattern"]["String"].get<std::string>();
      step.to = d.value("content", "");
    } else {
      step.kind = StepKind::kMetaspace;
      step.from = d.value("replacement", "\xE2\x96\x81");
      std::string scheme = d.value("prepend_scheme", "");
      step.prepend = scheme.empty() ? get_bool(d, "add_prefix_space", true) : scheme != "never";
    }
    steps.push_back(std::move(step));
    return Status::ok();
  }
  if (type == "ByteFallback") {
    has_byte_fallback_decoder = true;
    return Status::ok();
  }
  if (type == "Fuse") {
    return Status::ok();  // the output is always the concatenation
  }
  if (type == "Strip") {
    // Each count is type-checked before it is read: value<int>() of a float such as 1e300 is an
    // out-of-range conversion, and a negative start would wrap to a huge size_t.
    auto count = [&](const char* key) -> Result<size_t> {
      auto it = d.find(key);
      if (it == d.end())
        return size_t{0};
      if (!it->is_number_unsigned() || it->get<uint64_t>() > 64)
        return invalid_argument(std::string("tokenizer.json: Strip decoder '") + key +
                                "' must be an integer in 0..64");
      return static_cast<size_t>(it->get<uint64_t>());
    };
    auto content = d.find("content");
    if (content == d.end() || !content->is_string())
      return invalid_argument("tokenizer.json: Strip decoder has no string 'content'");
    ASSIGN_OR_RETURN(size_t stop, count("stop"));
    if (stop != 0 || !strip_char.empty()) {
      return unsupported("Strip decoder with stop > 0");
    }
    // Without a preceding Fuse, Strip applies to every token: not supported.
    strip_char = content->get<std::string>();
    ASSIGN_OR_RETURN(strip_start, count("start"));
    return Status::ok();
  }
  return unsupported("decoder type '" + type + "'");
}
Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string json, read_file(path));
  auto r = from_json(json);
  if (!r.is_ok()) {
    return r.status().with_context(path);
  }
  return r;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view json) {
  Json j;
  BigParts parts;
  try {
    TokenizerSax sax(&j, &parts);
    if (!Json::sax_parse(json.begin(), json.end(), &sax)) {
      return invalid_argument("tokenizer.json: malformed JSON");
    }
  } catch (const std::exception& e) {
    return invalid_argument(std::string("tokenizer.json: malformed JSON: ") + e.what());
  }
  auto impl = std::make_unique<Impl>();
  try {
    RETURN_IF_ERROR(impl->load(j, parts));
  } catch (const std::exception& e) {
    return invalid_argument(std::string("tokenizer.json: unexpected structure: ") + e.what());
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}
}  // namespace crescent::model
