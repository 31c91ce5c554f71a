#pragma once
// The parser half of engine/guided/regex.h: a pattern's text to an AST of code point sets,
// concatenations, alternations and bounded or unbounded repetitions. Internal to regex.cc.

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::engine::guided::regex_internal {

struct CodeRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
};
using CodeSet = std::vector<CodeRange>;  // sorted, disjoint, not adjacent once normalized

// A parsed regular expression.
struct Ast {
  enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  CodeSet set;                // kSet
  std::vector<Ast> children;  // kConcat, kAlt; kRepeat: exactly one
  int min = 0;                // kRepeat
  int max = -1;               // kRepeat; -1: unbounded
};

// InvalidArgument naming the problem and its byte offset (see regex.h for the syntax).
Result<Ast> parse_regex(std::string_view pattern);

}  // namespace crescent::engine::guided::regex_internal
