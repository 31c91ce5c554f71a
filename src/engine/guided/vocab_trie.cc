#include "engine/guided/vocab_trie.h"

#include <algorithm>
#include <numeric>

namespace crescent::engine::guided {

VocabTrie::VocabTrie(std::span<const std::string> token_bytes) {
  std::vector<int32_t> ids;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (!token_bytes[id].empty()) {
      ids.push_back(static_cast<int32_t>(id));
      max_depth_ = std::max(max_depth_, token_bytes[id].size());
    }
  }
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
}

void VocabTrie::allowed_tokens(const Matcher& m, std::vector<int32_t>* out) const {
  out->clear();
  while (scratch_.size() < max_depth_ + 1) {
    scratch_.push_back(m);
  }
  scratch_[0] = m;
  walk(0, 0, out);
}

void VocabTrie::walk(uint32_t node, size_t depth, std::vector<int32_t>* out) const {
  const TrieNode& n = nodes_[node];
  Matcher& child_state = scratch_[depth + 1];
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    child_state = scratch_[depth];
    if (!child_state.advance(nodes_[c].byte)) {
      continue;
    }
    const TrieNode& child = nodes_[c];
    out->insert(out->end(), token_ids_.begin() + child.first_token,
                token_ids_.begin() + child.first_token + child.num_tokens);
    if (child.num_children > 0) {
      walk(c, depth + 1, out);
    }
  }
}

}  // namespace crescent::engine::guided
