#pragma once
// VocabTrie: the vocabulary as a byte trie (each token's bytes as it decodes on its own), so the
// tokens a Matcher allows can be found by walking the trie with the matcher's state and
// pruning a subtree at its first rejected byte: one matcher step per trie node visited instead
// of one per byte of every token. Built once per engine. Not thread-safe (a walk uses scratch
// state): one per engine thread.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/guided/matcher.h"

namespace crescent::engine::guided {

class VocabTrie {
 public:
  // token_bytes[id]: the bytes of token id; an empty string is never allowed (special tokens).
  explicit VocabTrie(std::span<const std::string> token_bytes);

  // Appends to *out (cleared first) every token whose bytes `m` accepts, in trie order.
  void allowed_tokens(const Matcher& m, std::vector<int32_t>* out) const;

  size_t num_nodes() const { return all_.nodes.size(); }
  size_t max_depth() const { return max_depth_; }

 private:
  struct TrieNode {
    uint32_t first_child = 0;  // children are nodes[first_child, first_child + num_children)
    uint32_t num_children = 0;
    uint32_t first_token = 0;  // tokens ending here are token_ids[first_token, + num_tokens)
    uint32_t num_tokens = 0;
    uint8_t byte = 0;  // the edge from the parent
  };
  struct Trie {
    std::vector<TrieNode> nodes;  // nodes[0] is the root
    std::vector<int32_t> token_ids;
  };
  static Trie build(std::span<const std::string> token_bytes, std::vector<int32_t> ids);
  void walk(const Trie& trie, uint32_t node, size_t depth, std::vector<int32_t>* out) const;
  // The same walk for a matcher that is a root regex: one DFA lookup per node, no copies.
  void walk_dfa(uint32_t node, const RegexDfa& dfa, int32_t state, std::vector<int32_t>* out) const;

  Trie all_;
  // Inside a free string (Matcher::is_in_free_string) every token of whole plain UTF-8
  // characters is allowed as is, so only the others (with '"', '\\', a control byte or a
  // partial character) need the walk.
  std::vector<int32_t> plain_string_ids_;
  Trie not_plain_;
  size_t max_depth_ = 0;
  mutable std::vector<Matcher> scratch_;  // one state per depth during a walk
};

}  // namespace crescent::engine::guided
