#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "model/pretokenizer.h"
#include "model/unicode.h"

namespace crescent::model {
namespace {

using Json = nlohmann::json;
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map from a token-id pair to (merge rank, merged id).
class MergeMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) {
      cap <<= 1;
    }
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  // Returns false if the pair is already present (the first rank wins).
  bool insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, rank, merged};
        return true;
      }
      if (slots_[i].key == key) {
        return false;
      }
    }
  }
  // Returns the slot or nullptr.
  const std::pair<int32_t, int32_t>* find(int32_t a, int32_t b) const {
    if (slots_.empty()) {
      return nullptr;
    }
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        return &slots_[i].value;
      }
      if (slots_[i].key == kEmpty) {
        return nullptr;
      }
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    Slot(uint64_t k, int32_t rank, int32_t merged) : key(k), value(rank, merged) {}
    uint64_t key;
    std::pair<int32_t, int32_t> value;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

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

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Leftmost-longest matcher over a set of literal strings.
class LiteralMatcher {
 public:
  void add(std::string_view s, size_t index) {
    if (s.empty()) {
      return;
    }
    by_first_[static_cast<unsigned char>(s[0])].push_back({std::string(s), index});
    empty_ = false;
  }
  void finish() {
    for (auto& v : by_first_) {
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
        return a.first.size() > b.first.size();
      });
    }
  }
  bool empty() const { return empty_; }
  // Longest literal starting at text[pos]: returns its index and length.
  std::optional<std::pair<size_t, size_t>> match_at(std::string_view text, size_t pos) const {
    for (const auto& [lit, index] : by_first_[static_cast<unsigned char>(text[pos])]) {
      if (text.size() - pos >= lit.size() && text.compare(pos, lit.size(), lit) == 0) {
        return std::make_pair(index, lit.size());
      }
    }
    return std::nullopt;
  }

 private:
  std::array<std::vector<std::pair<std::string, size_t>>, 256> by_first_;
  bool empty_ = true;
};

enum class NormKind { kNfc, kNfkc, kPrepend, kReplace };
struct NormOp {
  NormKind kind;
  std::string a;
  std::string b;
};

enum class PreKind { kSplit, kMetaspaceSplit };
struct PreOp {
  PreKind kind;
  SplitPattern pattern = SplitPattern::kGpt2;
};

enum class PrependScheme { kAlways, kFirst, kNever };

enum class DecoderKind { kNone, kByteLevel, kPipeline };
enum class StepKind { kReplace, kMetaspace };
struct DecodeStep {
  StepKind kind;
  std::string from;  // kReplace pattern, or the Metaspace replacement
  std::string to;
  bool prepend = false;  // kMetaspace: drop the replacement in the first token
};

std::string to_hex_byte_token(unsigned b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string s = "<0x00>";
  s[3] = kHex[b >> 4];
  s[4] = kHex[b & 15];
  return s;
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty() || s->find(from) == std::string::npos) {
    return;
  }
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) {
      out.append(*s, pos, std::string::npos);
      break;
    }
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  *s = std::move(out);
}

bool is_ws_at_end(std::string_view s, size_t* cut) {
  // Finds the start of the trailing White_Space run of s.
  size_t pos = 0;
  size_t run_start = std::string::npos;
  while (pos < s.size()) {
    const size_t at = pos;
    const char32_t cp = unicode::next_code_point(s, &pos);
    if (unicode::is_whitespace(cp)) {
      if (run_start == std::string::npos) {
        run_start = at;
      }
    } else {
      run_start = std::string::npos;
    }
  }
  *cut = run_start == std::string::npos ? s.size() : run_start;
  return *cut != s.size();
}

size_t leading_ws_length(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!unicode::is_whitespace(unicode::next_code_point(s, &next))) {
      break;
    }
    pos = next;
  }
  return pos;
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

// The vocabulary and merges are most of an 11 MB tokenizer.json: a SAX pass stores them straight
// into vectors and builds a DOM only for the rest (model.vocab/model.merges become null there).
struct BigParts {
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // first structural problem in vocab/merges
};

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

constexpr size_t kNumCacheShards = 16;
constexpr size_t kMaxCacheEntriesPerShard = 8192;
constexpr size_t kMaxCachedPieceBytes = 128;

}  // namespace

struct Tokenizer::Impl {
  // Vocabulary (model vocab plus added tokens).
  std::vector<std::string> tokens;  // by id; "" for holes
  std::vector<uint8_t> present;
  std::vector<uint8_t> special;
  std::vector<int16_t> byte_value;       // ByteFallback: <0xNN> tokens' byte, else -1
  std::vector<std::string> token_bytes;  // byte-level decoding of each id
  StringMap vocab;                       // token string -> id

  // BPE model.
  MergeMap merges;
  bool byte_level = false;
  std::array<int32_t, 256> byte_ids{};  // byte-level char token / <0xNN> token of each byte
  StringMap raw_vocab;                  // byte-level: raw bytes -> id (for ignore_merges)
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;

  // Added tokens.
  std::vector<AddedToken> added;
  LiteralMatcher raw_matcher;         // tokens with normalized=false
  LiteralMatcher normalized_matcher;  // tokens with normalized=true

  // Pipeline.
  std::vector<NormOp> normalizers;
  bool byte_level_prefix_space = false;
  bool metaspace = false;
  std::string metaspace_replacement;
  PrependScheme metaspace_prepend = PrependScheme::kAlways;
  std::vector<PreOp> pre_ops;
  std::vector<int32_t> post_prefix;
  std::vector<int32_t> post_suffix;

  // Decoder.
  DecoderKind decoder = DecoderKind::kNone;
  std::vector<DecodeStep> steps;
  bool has_byte_fallback_decoder = false;
  size_t strip_start = 0;  // leading strip_char count removed from the fused output
  std::string strip_char;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<CacheShard, kNumCacheShards> cache;

  Status load(const Json& j, BigParts& parts);
  Status load_model(const Json& m, BigParts& parts);
  Status load_added(const Json& a);
  Status load_normalizer(const Json& n);
  Status load_pre_tokenizer(const Json& p, bool top_level);
  Status load_post_processor(const Json& p);
  Status load_decoder(const Json& d, bool top_level);
  Status set_token(int32_t id, const std::string& s);

  void encode_section(std::string_view section, bool first_section,
                      std::vector<int32_t>* ids) const;
  void encode_normalized(std::string text, bool first_section, std::vector<int32_t>* ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* ids) const;
  void bpe(std::string_view piece, std::vector<int32_t>* ids) const;
};

struct StreamingDetokenizer::State {
  std::string pending;  // byte-level: incomplete UTF-8; pipeline: current byte-fallback group
  size_t num_tokens = 0;
  size_t strip_left = 0;

  void push(const Tokenizer::Impl& t, int32_t id, bool skip_special, std::string* out);
  void flush(const Tokenizer::Impl& t, std::string* out);
  void strip(const Tokenizer::Impl& t, std::string_view s, std::string* out);
  void flush_group(std::string* out);
};

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

// ---------------------------------------------------------------------------------------------
// Encoding.

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  thread_local std::vector<Symbol> sym;
  sym.clear();
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  };
  if (byte_level) {
    for (char c : piece) {
      add(byte_ids[static_cast<unsigned char>(c)]);
    }
  } else {
    size_t pos = 0;
    bool pending_unk = false;
    while (pos < piece.size()) {
      const size_t start = pos;
      const int len = unicode::utf8_sequence_length(static_cast<unsigned char>(piece[pos]));
      pos += len;
      const std::string_view ch = piece.substr(start, len);
      auto it = vocab.find(ch);
      if (it != vocab.end()) {
        if (pending_unk) {
          add(*unk_id);
          pending_unk = false;
        }
        add(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (char c : ch) {
          all = all && byte_ids[static_cast<unsigned char>(c)] >= 0;
        }
        if (all) {
          if (pending_unk) {
            add(*unk_id);
            pending_unk = false;
          }
          for (char c : ch) {
            add(byte_ids[static_cast<unsigned char>(c)]);
          }
          continue;
        }
      }
      if (unk_id) {
        if (pending_unk && !fuse_unk) {
          add(*unk_id);
        }
        pending_unk = true;
      }
    }
    if (pending_unk) {
      add(*unk_id);
    }
  }
  if (sym.empty()) {
    return;
  }
  sym.back().next = -1;

  struct Merge {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Merge> heap_storage;
  heap_storage.clear();
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> heap(std::greater<Merge>(),
                                                                           std::move(heap_storage));
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    if (const auto* m = merges.find(sym[i].id, sym[i + 1].id)) {
      heap.push({m->first, static_cast<int32_t>(i), m->second});
    }
  }
  while (!heap.empty()) {
    const Merge top = heap.top();
    heap.pop();
    Symbol& s = sym[top.pos];
    if (!s.alive || s.next < 0) {
      continue;
    }
    Symbol& right = sym[s.next];
    const auto* m = merges.find(s.id, right.id);
    if (m == nullptr || m->second != top.merged) {
      continue;
    }
    s.id = top.merged;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) {
      sym[s.next].prev = top.pos;
    }
    if (s.prev >= 0) {
      if (const auto* pm = merges.find(sym[s.prev].id, s.id)) {
        heap.push({pm->first, s.prev, pm->second});
      }
    }
    if (s.next >= 0) {
      if (const auto* nm = merges.find(s.id, sym[s.next].id)) {
        heap.push({nm->first, top.pos, nm->second});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    ids->push_back(sym[i].id);
  }
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) {
    return;
  }
  if (ignore_merges) {
    const StringMap& m = byte_level ? raw_vocab : vocab;
    auto it = m.find(piece);
    if (it != m.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    bpe(piece, ids);
    return;
  }
  CacheShard& shard = cache[std::hash<std::string_view>{}(piece) % kNumCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(piece);
    if (it != shard.map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t begin = ids->size();
  bpe(piece, ids);
  std::vector<int32_t> result(ids->begin() + static_cast<std::ptrdiff_t>(begin), ids->end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kMaxCacheEntriesPerShard) {
    shard.map.clear();  // crude eviction: cheap, and the hot words come back at once
  }
  shard.map.emplace(std::string(piece), std::move(result));
}

void Tokenizer::Impl::encode_normalized(std::string text, bool first_section,
                                        std::vector<int32_t>* ids) const {
  if (text.empty()) {
    return;
  }
  if (byte_level_prefix_space && text[0] != ' ') {
    text.insert(text.begin(), ' ');
  }
  if (metaspace) {
    replace_all(&text, " ", metaspace_replacement);
    const bool prepend = metaspace_prepend == PrependScheme::kAlways ||
                         (metaspace_prepend == PrependScheme::kFirst && first_section);
    if (prepend && text.compare(0, metaspace_replacement.size(), metaspace_replacement) != 0) {
      text.insert(0, metaspace_replacement);
    }
  }
  thread_local std::vector<std::pair<size_t, size_t>> pieces, next;
  pieces.assign(1, {0, text.size()});
  for (const PreOp& op : pre_ops) {
    next.clear();
    for (const auto& [b, e] : pieces) {
      const std::string_view s(text.data() + b, e - b);
      const size_t before = next.size();
      if (op.kind == PreKind::kSplit) {
        split_with_pattern(op.pattern, s, &next);
      } else {
        size_t start = 0;
        size_t hit = s.find(metaspace_replacement, 1);
        while (hit != std::string_view::npos) {
          next.emplace_back(start, hit);
          start = hit;
          hit = s.find(metaspace_replacement, hit + 1);
        }
        next.emplace_back(start, s.size());
      }
      for (size_t k = before; k < next.size(); ++k) {
        next[k].first += b;
        next[k].second += b;
      }
    }
    pieces.swap(next);
  }
  // pieces is thread_local and encode_piece does not touch it; copy the views first anyway so
  // that a nested call can never observe a half-updated vector.
  const std::vector<std::pair<size_t, size_t>> local = pieces;
  for (const auto& [b, e] : local) {
    encode_piece(std::string_view(text.data() + b, e - b), ids);
  }
}

void Tokenizer::Impl::encode_section(std::string_view section, bool first_section,
                                     std::vector<int32_t>* ids) const {
  std::string text(section);
  for (const NormOp& op : normalizers) {
    switch (op.kind) {
      case NormKind::kNfc:
        text = unicode::nfc(text);
        break;
      case NormKind::kNfkc:
        text = unicode::nfkc(text);
        break;
      case NormKind::kPrepend:
        if (!text.empty()) {
          text.insert(0, op.a);
        }
        break;
      case NormKind::kReplace:
        replace_all(&text, op.a, op.b);
        break;
    }
  }
  if (normalized_matcher.empty()) {
    encode_normalized(std::move(text), first_section, ids);
    return;
  }
  size_t seg_start = 0;
  size_t pos = 0;
  bool first = first_section;
  while (pos < text.size()) {
    auto m = normalized_matcher.match_at(text, pos);
    if (!m) {
      ++pos;
      continue;
    }
    encode_normalized(text.substr(seg_start, pos - seg_start), first, ids);
    first = false;
    ids->push_back(added[m->first].id);
    pos += m->second;
    seg_start = pos;
  }
  encode_normalized(text.substr(seg_start), first, ids);
}

// ---------------------------------------------------------------------------------------------
// Decoding.

void StreamingDetokenizer::State::flush_group(std::string* out) {
  if (pending.empty()) {
    return;
  }
  if (unicode::is_valid_utf8(pending)) {
    out->append(pending);
  } else {
    for (size_t i = 0; i < pending.size(); ++i) {
      out->append(kReplacementChar);
    }
  }
  pending.clear();
}

void StreamingDetokenizer::State::strip(const Tokenizer::Impl& t, std::string_view s,
                                        std::string* out) {
  // Strip after Fuse removes up to strip_start leading strip chars of the whole output.
  while (strip_left > 0 && !s.empty()) {
    if (!t.strip_char.empty() && s.substr(0, t.strip_char.size()) == t.strip_char) {
      s.remove_prefix(t.strip_char.size());
      --strip_left;
    } else {
      strip_left = 0;
    }
  }
  out->append(s);
}

void StreamingDetokenizer::State::push(const Tokenizer::Impl& t, int32_t id, bool skip_special,
                                       std::string* out) {
  if (id < 0 || static_cast<size_t>(id) >= t.tokens.size() || !t.present[id]) {
    return;
  }
  if (skip_special && t.special[id]) {
    return;
  }
  const size_t index = num_tokens++;
  switch (t.decoder) {
    case DecoderKind::kNone:
      if (index > 0) {
        out->push_back(' ');
      }
      out->append(t.tokens[id]);
      return;
    case DecoderKind::kByteLevel: {
      pending.append(t.token_bytes[id]);
      const size_t n = unicode::complete_prefix_length(pending);
      if (n > 0) {
        unicode::append_utf8_lossy(std::string_view(pending).substr(0, n), out);
        pending.erase(0, n);
      }
      return;
    }
    case DecoderKind::kPipeline:
      break;
  }
  if (t.has_byte_fallback_decoder && t.byte_value[id] >= 0) {
    pending.push_back(static_cast<char>(t.byte_value[id]));
    return;
  }
  std::string text = t.tokens[id];
  for (const DecodeStep& step : t.steps) {
    if (step.kind == StepKind::kReplace) {
      replace_all(&text, step.from, step.to);
    } else {
      replace_all(&text, step.from, index == 0 && step.prepend ? "" : " ");
    }
  }
  std::string piece;
  flush_group(&piece);
  piece.append(text);
  strip(t, piece, out);
}

void StreamingDetokenizer::State::flush(const Tokenizer::Impl& t, std::string* out) {
  if (t.decoder == DecoderKind::kByteLevel) {
    unicode::append_utf8_lossy(pending, out);
    pending.clear();
  } else {
    std::string piece;
    flush_group(&piece);
    strip(t, piece, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Public API.

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found("cannot open tokenizer file " + path);
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return data_loss("cannot read tokenizer file " + path);
  }
  auto r = from_json(buf.str());
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

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text,
                                               bool add_special_tokens) const {
  if (!unicode::is_valid_utf8(text)) {
    return invalid_argument("tokenizer: input text is not valid UTF-8");
  }
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) {
    ids.insert(ids.end(), t.post_prefix.begin(), t.post_prefix.end());
  }
  // Split the raw text on added tokens (leftmost-longest), honouring lstrip/rstrip.
  size_t seg_start = 0;
  size_t pos = 0;
  size_t section = 0;
  auto flush_segment = [&](std::string_view seg) {
    if (!seg.empty()) {
      t.encode_section(seg, section == 0, &ids);
      ++section;
    }
  };
  while (pos < text.size() && !t.raw_matcher.empty()) {
    auto m = t.raw_matcher.match_at(text, pos);
    if (!m) {
      ++pos;
      continue;
    }
    const AddedToken& tok = t.added[m->first];
    std::string_view before = text.substr(seg_start, pos - seg_start);
    if (tok.lstrip) {
      size_t cut;
      if (is_ws_at_end(before, &cut)) {
        before = before.substr(0, cut);
      }
    }
    flush_segment(before);
    ids.push_back(tok.id);
    ++section;
    pos += m->second;
    if (tok.rstrip) {
      pos += leading_ws_length(text.substr(pos));
    }
    seg_start = pos;
  }
  flush_segment(text.substr(seg_start));
  if (add_special_tokens) {
    ids.insert(ids.end(), t.post_suffix.begin(), t.post_suffix.end());
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  StreamingDetokenizer::State state;
  state.strip_left = impl_->strip_start;
  std::string out;
  for (int32_t id : ids) {
    state.push(*impl_, id, skip_special_tokens, &out);
  }
  state.flush(*impl_, &out);
  return out;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->tokens.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) {
    return std::nullopt;
  }
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return "";
  }
  return impl_->tokens[id];
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= vocab_size() || !t.present[id] || t.special[id]) {
    return "";
  }
  switch (t.decoder) {
    case DecoderKind::kNone:
      return t.tokens[id];
    case DecoderKind::kByteLevel:
      return t.token_bytes[id];
    case DecoderKind::kPipeline:
      break;
  }
  if (t.has_byte_fallback_decoder && t.byte_value[id] >= 0) {
    return std::string(1, static_cast<char>(t.byte_value[id]));
  }
  std::string text = t.tokens[id];
  for (const DecodeStep& step : t.steps) {
    replace_all(&text, step.from, step.kind == StepKind::kReplace ? step.to : " ");
  }
  return text;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id] != 0;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer),
      skip_special_tokens_(skip_special_tokens),
      state_(std::make_unique<State>()) {
  state_->strip_left = tokenizer.impl_->strip_start;
}
StreamingDetokenizer::~StreamingDetokenizer() = default;
StreamingDetokenizer::StreamingDetokenizer(StreamingDetokenizer&&) noexcept = default;
StreamingDetokenizer& StreamingDetokenizer::operator=(StreamingDetokenizer&&) noexcept = default;

std::string StreamingDetokenizer::push(int32_t id) {
  std::string out;
  state_->push(*tokenizer_->impl_, id, skip_special_tokens_, &out);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  state_->flush(*tokenizer_->impl_, &out);
  state_ = std::make_unique<State>();
  state_->strip_left = tokenizer_->impl_->strip_start;
  return out;
}

}  // namespace crescent::model
