#pragma once
// Grammar: what guided decoding lets a request produce, compiled once per request from its
// constraint (a JSON Schema subset, "any JSON object", a regex or a list of choices) into a small
// immutable tree of nodes that a Matcher walks byte by byte. Shared (read-only) between the
// matcher copies of one request; thread-safe once built.

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/guided/regex.h"
#include "engine/sampling_params.h"

namespace crescent::engine::guided {

enum class NodeKind : uint8_t {
  kAny,         // any JSON value
  kObject,      // a JSON object: the listed properties in order, or any keys (any_keys)
  kArray,       // a JSON array of `items`
  kString,      // a JSON string
  kNumber,      // a JSON number
  kInteger,     // a JSON number without fraction or exponent
  kLiteralSet,  // exactly one of `literals` (JSON texts, or raw strings for a choice)
  kAnyOf,       // one of `branches`, told apart by their first byte
  kRegex,       // raw text matching `regex` in full (guided_regex)
  // One of `branches`, all objects whose first property is the same required key
  // (properties[0].key) with a different string constant each (literals[i] for branches[i]):
  // the constant picks the branch, e.g. tool calls {"name": "f", "parameters": {...}}.
  kTaggedUnion,
};

struct Property {
  std::string key;  // as it appears between the quotes (JSON-escaped)
  bool is_required = false;
  int32_t value = -1;  // node index
};

struct Node {
  NodeKind kind = NodeKind::kAny;
  std::vector<Property> properties;   // kObject, at most kMaxLiterals
  bool any_keys = false;              // kObject: any keys with any values
  int32_t items = -1;                 // kArray: node index
  int64_t min_items = 0;              // kArray
  int64_t max_items = -1;             // kArray; -1: unbounded
  int64_t min_length = 0;             // kString, in code points
  int64_t max_length = -1;            // kString; -1: unbounded
  std::vector<std::string> literals;  // kLiteralSet, at most kMaxLiterals
  std::vector<int32_t> branches;      // kAnyOf
  // kRegex: the whole value. kString: its content (JSON Schema `pattern`, which may not
  // produce bytes that need escaping); null for a string without a pattern.
  std::shared_ptr<const RegexDfa> regex;
  std::bitset<256> first_bytes;  // the bytes a value of this node can begin with
};

// Bounds that keep every state small and every output finite.
inline constexpr int kMaxLiterals = 64;     // enum values, choices, properties of one object
inline constexpr int kMaxDepth = 32;        // nesting of arrays and objects
inline constexpr int kMaxWhitespace = 4;    // consecutive whitespace bytes between tokens
inline constexpr int kMaxNumberBytes = 24;  // bytes of one JSON number

struct Grammar {
  std::vector<Node> nodes;
  int32_t root = -1;
  // The shared nodes every grammar starts with (see make_base_grammar()).
  static constexpr int32_t kAnyValue = 0;
  static constexpr int32_t kAnyObject = 1;
  static constexpr int32_t kAnyArray = 2;
  static constexpr int32_t kAnyString = 3;
  static constexpr int32_t kAnyNumber = 4;
  static constexpr int32_t kTrueFalseNull = 5;
};

// A grammar whose nodes are only the shared ones; root unset.
Grammar make_base_grammar();
// Appends `node` (computing its first_bytes) and returns its index.
int32_t add_node(Grammar& g, Node node);

// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> compile_json_object();
// A JSON Schema (response_format json_schema, guided_json); `schema_json` is its JSON text.
// InvalidArgument naming the unsupported keyword and where it is, e.g.
// "unsupported JSON Schema keyword 'pattern' at $.properties.name".
Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_json);
// Raw text that matches `pattern` in full (guided_regex); InvalidArgument as compile_regex().
Result<std::shared_ptr<const Grammar>> compile_regex_text(std::string_view pattern);
// Exactly one of `choices`, as raw text (guided_choice).
Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices);

// The grammar of an active constraint (any kind above).
Result<std::shared_ptr<const Grammar>> compile(const GuidedDecoding& guided);

}  // namespace crescent::engine::guided
