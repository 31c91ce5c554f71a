#include "engine/guided/vocab_trie.h"

#include <algorithm>
#include <numeric>

namespace crescent::engine::guided {

namespace {

// Whole UTF-8 characters, none of them '"', '\\' or a control character: a free string
// (Matcher::is_in_free_string) accepts them and is left as it was.
bool is_plain_string_text(const std::string& t) {
  size_t i = 0;
  while (i < t.size()) {
    const auto b = static_cast<uint8_t>(t[i]);
    if (b < 0x20 || b == '"' || b == '\\' || (b >= 0x80 && b < 0xC2) || b > 0xF4) {
      return false;
    }
    const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (i + len > t.size()) {
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<uint8_t>(t[i + k]) & 0xC0) != 0x80) {
        return false;
      }
    }
    i += len;
  }
  return true;
}

}  // namespace

VocabTrie::VocabTrie(std::span<const std::string> token_bytes) {
  std::vector<int32_t> ids;
  std::vector<int32_t> not_plain;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& t = token_bytes[id];
    if (t.empty()) {
      continue;
    }
    ids.push_back(static_cast<int32_t>(id));
    max_depth_ = std::max(max_depth_, t.size());
    if (is_plain_string_text(t)) {
      plain_string_ids_.push_back(static_cast<int32_t>(id));
    } else {
      not_plain.push_back(static_cast<int32_t>(id));
    }
  }
  all_ = build(token_bytes, std::move(ids));
  not_plain_ = build(token_bytes, std::move(not_plain));
}

VocabTrie::Trie VocabTrie::build(std::span<const std::string> token_bytes,
                                 std::vector<int32_t> ids) {
  Trie trie;
  std::vector<TrieNode>& nodes_ = trie.nodes;
  std::vector<int32_t>& token_ids_ = trie.token_ids;
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return token_bytes[a] < token_bytes[b] || (token_bytes[a] == token_bytes[b] && a < b);
  });
  // Breadth-first over ranges of the sorted ids that share a prefix of `depth` bytes, so each
  // node's children are allocated next to each other.
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  nodes_.emplace_back();
  std::vector<Pending> queue = {{0, 0, ids.size(), 0}};
  token_ids_.reserve(ids.size());
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    size_t i = p.lo;
    nodes_[p.node].first_token = static_cast<uint32_t>(token_ids_.size());
    while (i < p.hi && token_bytes[ids[i]].size() == p.depth) {
      token_ids_.push_back(ids[i++]);
    }
    nodes_[p.node].num_tokens =
        static_cast<uint32_t>(token_ids_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = static_cast<uint32_t>(nodes_.size());
    while (i < p.hi) {
      const char b = token_bytes[ids[i]][p.depth];
      size_t j = i;
      while (j < p.hi && token_bytes[ids[j]][p.depth] == b) {
        ++j;
      }
      const auto child = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
      nodes_.back().byte = static_cast<uint8_t>(b);
      ++nodes_[p.node].num_children;
      queue.push_back({child, i, j, p.depth + 1});
      i = j;
    }
  }
  return trie;
}

void VocabTrie::allowed_tokens(const Matcher& m, std::vector<int32_t>* out) const {
  out->clear();
  while (scratch_.size() < max_depth_ + 1) {
    scratch_.push_back(m);
  }
  int32_t state = 0;
  if (const RegexDfa* dfa = m.root_regex(&state)) {
    walk_dfa(0, *dfa, state, out);
    return;
  }
  scratch_[0] = m;
  if (m.is_in_free_string()) {
    out->assign(plain_string_ids_.begin(), plain_string_ids_.end());
    walk(not_plain_, 0, 0, out);
  } else {
    walk(all_, 0, 0, out);
  }
}

void VocabTrie::walk(const Trie& trie, uint32_t node, size_t depth,
                     std::vector<int32_t>* out) const {
  const TrieNode& n = trie.nodes[node];
  Matcher& child_state = scratch_[depth + 1];
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    child_state = scratch_[depth];
    if (!child_state.advance(trie.nodes[c].byte)) {
      continue;
    }
    const TrieNode& child = trie.nodes[c];
    out->insert(out->end(), trie.token_ids.begin() + child.first_token,
                trie.token_ids.begin() + child.first_token + child.num_tokens);
    if (child.num_children > 0) {
      walk(trie, c, depth + 1, out);
    }
  }
}

void VocabTrie::walk_dfa(uint32_t node, const RegexDfa& dfa, int32_t state,
                         std::vector<int32_t>* out) const {
  const TrieNode& n = all_.nodes[node];
  const std::array<int32_t, 256>& next = dfa.next[static_cast<size_t>(state)];
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    const TrieNode& child = all_.nodes[c];
    const int32_t s = next[child.byte];
    if (s < 0) {
      continue;
    }
    out->insert(out->end(), all_.token_ids.begin() + child.first_token,
                all_.token_ids.begin() + child.first_token + child.num_tokens);
    if (child.num_children > 0) {
      walk_dfa(c, dfa, s, out);
    }
  }
}

}  // namespace crescent::engine::guided
