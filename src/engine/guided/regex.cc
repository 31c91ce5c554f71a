#include "engine/guided/regex.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "engine/guided/regex_parse.h"

namespace crescent::engine::guided {
namespace {

using regex_internal::Ast;
using regex_internal::CodeRange;

// ---- UTF-8 byte ranges of a code point range ----

struct ByteRange {
  uint8_t lo = 0;
  uint8_t hi = 0;
};
using ByteSeq = std::vector<ByteRange>;

int utf8_length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

std::vector<uint8_t> utf8_bytes(uint32_t cp) {
  const int n = utf8_length(cp);
  if (n == 1) {
    return {static_cast<uint8_t>(cp)};
  }
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (int i = n - 1; i > 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  const uint8_t lead = n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0;
  out[0] = static_cast<uint8_t>(lead | cp);
  return out;
}

// Splits [lo, hi] into sequences of byte ranges whose product is exactly the UTF-8 encodings
// of the range (the standard construction, as in RE2 and Rust's utf8-ranges).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>* out) {
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && boundary < hi) {
      utf8_sequences(lo, boundary, out);
      utf8_sequences(boundary + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t mask = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        utf8_sequences(lo, lo | mask, out);
        utf8_sequences((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        utf8_sequences(lo, (hi & ~mask) - 1, out);
        utf8_sequences(hi & ~mask, hi, out);
        return;
      }
    }
  }
  const std::vector<uint8_t> a = utf8_bytes(lo);
  const std::vector<uint8_t> b = utf8_bytes(hi);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.push_back({a[i], b[i]});
  }
  out->push_back(std::move(seq));
}

// ---- Thompson NFA, built backwards from each fragment's continuation ----

struct NfaState {
  int16_t lo = -1;  // a byte transition [lo, hi] -> out; -1: epsilon edges only
  int16_t hi = -1;
  int32_t out = -1;
  std::vector<int32_t> eps;
};

class NfaBuilder {
 public:
  Result<int32_t> build(const Ast& ast, int32_t next) {
    switch (ast.kind) {
      case Ast::Kind::kEmpty:
        return next;
      case Ast::Kind::kSet: {
        std::vector<ByteSeq> seqs;
        for (const CodeRange& r : ast.set) {
          utf8_sequences(r.lo, r.hi, &seqs);
        }
        ASSIGN_OR_RETURN(int32_t split, add());
        for (const ByteSeq& seq : seqs) {
          int32_t cont = next;
          for (size_t i = seq.size(); i-- > 0;) {
            ASSIGN_OR_RETURN(cont, add_byte(seq[i], cont));
          }
          states_[static_cast<size_t>(split)].eps.push_back(cont);
        }
        return split;
      }
      case Ast::Kind::kConcat:
        for (size_t i = ast.children.size(); i-- > 0;) {
          ASSIGN_OR_RETURN(next, build(ast.children[i], next));
        }
        return next;
      case Ast::Kind::kAlt: {
        ASSIGN_OR_RETURN(int32_t split, add());
        for (const Ast& child : ast.children) {
          ASSIGN_OR_RETURN(int32_t start, build(child, next));
          states_[static_cast<size_t>(split)].eps.push_back(start);
        }
        return split;
      }
      case Ast::Kind::kRepeat: {
        const Ast& child = ast.children[0];
        if (ast.max < 0) {
          ASSIGN_OR_RETURN(int32_t loop, add());
          ASSIGN_OR_RETURN(int32_t body, build(child, loop));
          states_[static_cast<size_t>(loop)].eps = {body, next};
          next = loop;
        } else {
          for (int i = ast.min; i < ast.max; ++i) {
            ASSIGN_OR_RETURN(int32_t body, build(child, next));
            ASSIGN_OR_RETURN(int32_t split, add());
            states_[static_cast<size_t>(split)].eps = {body, next};
            next = split;
          }
        }
        for (int i = 0; i < ast.min; ++i) {
          ASSIGN_OR_RETURN(next, build(child, next));
        }
        return next;
      }
    }
    return next;
  }

  Result<int32_t> add() {
    if (states_.size() >= static_cast<size_t>(kMaxRegexNfaStates)) {
      return invalid_argument("the regex is too large (over " + std::to_string(kMaxRegexNfaStates) +
                              " automaton states once its repetitions are expanded)");
    }
    states_.emplace_back();
    return static_cast<int32_t>(states_.size() - 1);
  }
  Result<int32_t> add_byte(ByteRange r, int32_t out) {
    ASSIGN_OR_RETURN(int32_t s, add());
    NfaState& st = states_[static_cast<size_t>(s)];
    st.lo = r.lo;
    st.hi = r.hi;
    st.out = out;
    return s;
  }

  std::vector<NfaState> states_;
};

// The byte states and the accept state reachable from `seeds` by epsilon edges, sorted.
std::vector<int32_t> closure(const std::vector<NfaState>& nfa, std::vector<int32_t> seeds,
                             int32_t accept, std::vector<uint32_t>& mark, uint32_t stamp) {
  std::vector<int32_t> out;
  while (!seeds.empty()) {
    const int32_t s = seeds.back();
    seeds.pop_back();
    if (mark[static_cast<size_t>(s)] == stamp) {
      continue;
    }
    mark[static_cast<size_t>(s)] = stamp;
    const NfaState& st = nfa[static_cast<size_t>(s)];
    if (st.lo >= 0 || s == accept) {
      out.push_back(s);
    }
    seeds.insert(seeds.end(), st.eps.begin(), st.eps.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<RegexDfa> determinize(const std::vector<NfaState>& nfa, int32_t start, int32_t accept) {
  RegexDfa dfa;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  std::vector<uint32_t> mark(nfa.size(), 0);
  uint32_t stamp = 0;
  auto intern = [&](std::vector<int32_t> set) -> Result<int32_t> {
    auto it = ids.find(set);
    if (it != ids.end()) {
      return it->second;
    }
    if (sets.size() >= static_cast<size_t>(kMaxRegexDfaStates)) {
      return invalid_argument("the regex is too complex (over " +
                              std::to_string(kMaxRegexDfaStates) + " DFA states)");
    }
    const auto id = static_cast<int32_t>(sets.size());
    dfa.accepting.push_back(std::binary_search(set.begin(), set.end(), accept) ? 1 : 0);
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  RETURN_IF_ERROR(intern(closure(nfa, {start}, accept, mark, ++stamp)).status());
  for (size_t d = 0; d < sets.size(); ++d) {
    std::array<std::vector<int32_t>, 256> buckets;
    for (int32_t s : sets[d]) {
      const NfaState& st = nfa[static_cast<size_t>(s)];
      for (int b = st.lo; st.lo >= 0 && b <= st.hi; ++b) {
        buckets[static_cast<size_t>(b)].push_back(st.out);
      }
    }
    std::array<int32_t, 256> next;
    next.fill(-1);
    for (size_t b = 0; b < 256; ++b) {
      if (buckets[b].empty()) {
        continue;
      }
      if (b > 0 && buckets[b] == buckets[b - 1]) {
        next[b] = next[b - 1];
        continue;
      }
      ASSIGN_OR_RETURN(next[b], intern(closure(nfa, buckets[b], accept, mark, ++stamp)));
    }
    dfa.next.push_back(next);
  }
  return dfa;
}

// Cuts every transition into a state from which no accepting state is reachable.
Status prune_dead_ends(RegexDfa* dfa) {
  const size_t n = dfa->next.size();
  std::vector<std::vector<int32_t>> preds(n);
  for (size_t s = 0; s < n; ++s) {
    for (int32_t t : dfa->next[s]) {
      if (t >= 0) {
        preds[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
      }
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> todo;
  for (size_t s = 0; s < n; ++s) {
    if (dfa->accepting[s] != 0) {
      live[s] = 1;
      todo.push_back(static_cast<int32_t>(s));
    }
  }
  while (!todo.empty()) {
    const int32_t s = todo.back();
    todo.pop_back();
    for (int32_t p : preds[static_cast<size_t>(s)]) {
      if (live[static_cast<size_t>(p)] == 0) {
        live[static_cast<size_t>(p)] = 1;
        todo.push_back(p);
      }
    }
  }
  if (live[0] == 0) {
    return invalid_argument("the regex matches no text");
  }
  dfa->has_exit.assign(n, 0);
  for (size_t s = 0; s < n; ++s) {
    for (int32_t& t : dfa->next[s]) {
      if (t >= 0 && live[static_cast<size_t>(t)] == 0) {
        t = -1;
      }
      dfa->has_exit[s] |= t >= 0 ? 1 : 0;
    }
  }
  return Status::ok();
}

}  // namespace

int32_t RegexDfa::walk(int32_t state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state < 0) {
      return -1;
    }
    state = next[static_cast<size_t>(state)][static_cast<uint8_t>(c)];
  }
  return state;
}

bool RegexDfa::matches(std::string_view bytes) const {
  const int32_t s = walk(0, bytes);
  return s >= 0 && accepting[static_cast<size_t>(s)] != 0;
}

Result<std::shared_ptr<const RegexDfa>> without_bytes(const RegexDfa& dfa,
                                                      const std::bitset<256>& banned) {
  RegexDfa out = dfa;
  for (std::array<int32_t, 256>& next : out.next) {
    for (size_t b = 0; b < 256; ++b) {
      if (banned.test(b)) {
        next[b] = -1;
      }
    }
  }
  RETURN_IF_ERROR(prune_dead_ends(&out));
  return std::shared_ptr<const RegexDfa>(std::make_shared<RegexDfa>(std::move(out)));
}

Result<std::shared_ptr<const RegexDfa>> compile_regex(std::string_view pattern) {
  ASSIGN_OR_RETURN(Ast ast, regex_internal::parse_regex(pattern));
  NfaBuilder builder;
  ASSIGN_OR_RETURN(int32_t accept, builder.add());
  ASSIGN_OR_RETURN(int32_t start, builder.build(ast, accept));
  ASSIGN_OR_RETURN(RegexDfa dfa, determinize(builder.states_, start, accept));
  RETURN_IF_ERROR(prune_dead_ends(&dfa));
  return std::shared_ptr<const RegexDfa>(std::make_shared<RegexDfa>(std::move(dfa)));
}

}  // namespace crescent::engine::guided
