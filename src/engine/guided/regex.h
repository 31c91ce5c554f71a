#pragma once
// Regular expressions for guided decoding (vLLM's `guided_regex`, JSON Schema's `pattern`),
// compiled to a byte-level DFA that the Matcher walks one output byte at a time.
//
// The syntax is the common subset of Python's `re` that constrained-decoding users write:
// literals (UTF-8 included), `.`, classes `[a-z]`/`[^...]` (code point ranges, non-ASCII
// included), `\d \w \s \D \W \S` (ASCII meanings, as with re.ASCII), escapes `\n \t \r \f \v
// \xHH \uHHHH` and escaped punctuation, groups `(...)`, `(?:...)`, `(?P<name>...)`,
// alternation, and the quantifiers `* + ? {m} {m,} {m,n} {,n}` (a lazy `?` suffix matches the
// same language, so it is accepted). `^` at the start and `$` at the end are accepted (the
// whole output must match anyway). Anything else (backreferences, lookaround, inline flags,
// word boundaries, possessive quantifiers) is refused with InvalidArgument naming it, never
// approximated. `.` and negated classes match any UTF-8 encoded code point (surrogates
// excluded) except what they exclude; `.` excludes only '\n', as in Python.

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::engine::guided {

// Bounds that keep compilation time and memory small (a DFA state is 1 KiB of transitions).
inline constexpr int kMaxRegexBytes = 4096;       // of the pattern
inline constexpr int kMaxRegexRepeat = 1000;      // m and n of {m,n}
inline constexpr int kMaxRegexNfaStates = 65536;  // after repetitions are expanded
inline constexpr int kMaxRegexDfaStates = 4096;

// A deterministic automaton over bytes. State 0 is the start. Every state can still reach an
// accepting state (dead ends are pruned), so a walk that only takes transitions >= 0 never
// gets stuck before a match is complete.
struct RegexDfa {
  std::vector<std::array<int32_t, 256>> next;  // -1: the byte is not allowed there
  std::vector<uint8_t> accepting;              // 1: the bytes so far are a full match
  std::vector<uint8_t> has_exit;               // 1: some byte may follow

  // The state after `bytes` from `state`, or -1.
  int32_t walk(int32_t state, std::string_view bytes) const;
  bool matches(std::string_view bytes) const;  // the whole of `bytes`, from the start
};

// InvalidArgument naming the problem and its byte offset, e.g.
// "unsupported regex syntax '(?=' (lookahead) at offset 3".
Result<std::shared_ptr<const RegexDfa>> compile_regex(std::string_view pattern);

// A copy of `dfa` that never produces a byte in `banned` (dead ends pruned again);
// InvalidArgument "the regex matches no text" when nothing is left.
Result<std::shared_ptr<const RegexDfa>> without_bytes(const RegexDfa& dfa,
                                                      const std::bitset<256>& banned);

}  // namespace crescent::engine::guided
