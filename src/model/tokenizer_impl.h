// The tokenizer's internal state, shared by tokenizer_load.cc (tokenizer.json -> Impl) and
// tokenizer.cc (encoding, decoding, the public API). Not part of the model module's interface.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace crescent::model {
namespace tokenizer_impl {

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

constexpr size_t kNumCacheShards = 16;

// The vocabulary and merges as the loader's SAX pass collected them (tokenizer_load.cc).
struct BigParts;

}  // namespace tokenizer_impl

struct Tokenizer::Impl {
  // Vocabulary (model vocab plus added tokens).
  std::vector<std::string> tokens;  // by id; "" for holes
  std::vector<uint8_t> present;
  std::vector<uint8_t> special;
  std::vector<int16_t> byte_value;       // ByteFallback: <0xNN> tokens' byte, else -1
  std::vector<std::string> token_bytes;  // byte-level decoding of each id
  tokenizer_impl::StringMap vocab;       // token string -> id

  // BPE model.
  tokenizer_impl::MergeMap merges;
  bool byte_level = false;
  std::array<int32_t, 256> byte_ids{};  // byte-level char token / <0xNN> token of each byte
  tokenizer_impl::StringMap raw_vocab;  // byte-level: raw bytes -> id (for ignore_merges)
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;

  // Added tokens.
  std::vector<tokenizer_impl::AddedToken> added;
  tokenizer_impl::LiteralMatcher raw_matcher;         // tokens with normalized=false
  tokenizer_impl::LiteralMatcher normalized_matcher;  // tokens with normalized=true

  // Pipeline.
  std::vector<tokenizer_impl::NormOp> normalizers;
  bool byte_level_prefix_space = false;
  bool metaspace = false;
  std::string metaspace_replacement;
  tokenizer_impl::PrependScheme metaspace_prepend = tokenizer_impl::PrependScheme::kAlways;
  std::vector<tokenizer_impl::PreOp> pre_ops;
  std::vector<int32_t> post_prefix;
  std::vector<int32_t> post_suffix;

  // Decoder.
  tokenizer_impl::DecoderKind decoder = tokenizer_impl::DecoderKind::kNone;
  std::vector<tokenizer_impl::DecodeStep> steps;
  bool has_byte_fallback_decoder = false;
  size_t strip_start = 0;  // leading strip_char count removed from the fused output
  std::string strip_char;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, tokenizer_impl::StringHash,
                       std::equal_to<>>
        map;
  };
  mutable std::array<CacheShard, tokenizer_impl::kNumCacheShards> cache;

  Status load(const nlohmann::json& j, tokenizer_impl::BigParts& parts);
  Status load_model(const nlohmann::json& m, tokenizer_impl::BigParts& parts);
  Status load_added(const nlohmann::json& a);
  Status load_normalizer(const nlohmann::json& n);
  Status load_pre_tokenizer(const nlohmann::json& p, bool top_level);
  Status load_post_processor(const nlohmann::json& p);
  Status load_decoder(const nlohmann::json& d, bool top_level);
  Status set_token(int32_t id, const std::string& s);

  void encode_section(std::string_view section, bool first_section,
                      std::vector<int32_t>* ids) const;
  void encode_normalized(std::string text, bool first_section, std::vector<int32_t>* ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* ids) const;
  void bpe(std::string_view piece, std::vector<int32_t>* ids) const;
};

}  // namespace crescent::model
