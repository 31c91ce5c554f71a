#include "model/tokenizer.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace crescent::model {

using namespace tokenizer_impl;  // NOLINT(google-build-using-namespace): Impl's own types

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
constexpr size_t kMaxCacheEntriesPerShard = 8192;
constexpr size_t kMaxCachedPieceBytes = 128;

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

}  // namespace

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
