#include "engine/guided/grammar.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/check.h"
#include "core/json.h"

namespace crescent::engine::guided {
namespace {

using json = nlohmann::ordered_json;

std::bitset<256> first_bytes_of(const Grammar& g, const Node& n) {
  std::bitset<256> out;
  auto set = [&out](std::string_view chars) {
    for (char c : chars) {
      out.set(static_cast<uint8_t>(c));
    }
  };
  switch (n.kind) {
    case NodeKind::kAny:
      set("{[\"-0123456789tfn");
      break;
    case NodeKind::kObject:
      set("{");
      break;
    case NodeKind::kArray:
      set("[");
      break;
    case NodeKind::kString:
      set("\"");
      break;
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      set("-0123456789");
      break;
    case NodeKind::kLiteralSet:
      for (const std::string& lit : n.literals) {
        if (!lit.empty()) {
          out.set(static_cast<uint8_t>(lit[0]));
        }
      }
      break;
    case NodeKind::kAnyOf:
      for (int32_t b : n.branches) {
        out |= g.nodes[b].first_bytes;
      }
      break;
    case NodeKind::kTaggedUnion:
      set("{");
      break;
    case NodeKind::kRegex:
      for (size_t b = 0; b < 256; ++b) {
        out.set(b, n.regex->next[0][b] >= 0);
      }
      break;
  }
  return out;
}

// The automaton of a string's content without the bytes that JSON would have to escape.
Result<std::shared_ptr<const RegexDfa>> without_escaped_bytes(const RegexDfa& dfa) {
  std::bitset<256> banned;
  for (size_t b = 0; b < 0x20; ++b) {
    banned.set(b);
  }
  banned.set('"');
  banned.set('\\');
  return without_bytes(dfa, banned);
}

// Compiles one (sub)schema; `path` names where it sits, for error messages ("$.properties.a").
class SchemaCompiler {
 public:
  explicit SchemaCompiler(Grammar* g) : g_(g) {}

  Result<int32_t> compile(const json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) {
      return invalid_argument("the JSON Schema nests more than " + std::to_string(kMaxDepth) +
                              " levels (at " + path + ")");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) {
        return Grammar::kAnyValue;
      }
      return invalid_argument("the JSON Schema at " + path + " is false: nothing matches it");
    }
    if (!s.is_object()) {
      return invalid_argument("the JSON Schema at " + path + " must be an object or a boolean");
    }
    static constexpr const char* kIgnored[] = {"title",   "description", "$schema",  "$id",
                                               "default", "examples",    "$comment", "strict"};
    static constexpr const char* kSupported[] = {
        "type",      "properties", "required", "additionalProperties",
        "items",     "minItems",   "maxItems", "enum",
        "const",     "anyOf",      "oneOf",    "maxLength",
        "minLength", "pattern"};
    for (const auto& item : s.items()) {
      // A named reference, not a structured binding: clang 14 cannot capture bindings.
      const std::string& key = item.key();
      const bool known =
          std::find_if(std::begin(kSupported), std::end(kSupported),
                       [&](const char* k) { return key == k; }) != std::end(kSupported) ||
          std::find_if(std::begin(kIgnored), std::end(kIgnored),
                       [&](const char* k) { return key == k; }) != std::end(kIgnored);
      if (!known) {
        return invalid_argument("unsupported JSON Schema keyword '" + key + "' at " + path);
      }
    }
    if (s.contains("enum") || s.contains("const")) {
      return compile_literals(s, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (s.contains(key)) {
        return compile_any_of(s[key], path + "." + key, depth);
      }
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& e : t) {
          if (!e.is_string()) {
            return invalid_argument("'type' at " + path + " must be a string or strings");
          }
          types.push_back(e.get<std::string>());
        }
      } else {
        return invalid_argument("'type' at " + path + " must be a string or strings");
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("maxLength") || s.contains("minLength") || s.contains("pattern")) {
      types.push_back("string");
    } else {
      return Grammar::kAnyValue;
    }
    if (types.size() == 1) {
      return compile_type(s, types[0], path, depth);
    }
    Node any_of;
    any_of.kind = NodeKind::kAnyOf;
    for (const std::string& t : types) {
      ASSIGN_OR_RETURN(int32_t b, compile_type(s, t, path, depth));
      any_of.branches.push_back(b);
    }
    RETURN_IF_ERROR(check_disjoint(any_of, path + ".type"));
    return add_node(*g_, std::move(any_of));
  }

 private:
  // Every keyword in `s` other than the type's own and the annotations is refused, so none is
  // silently ignored (e.g. maxLength on an integer).
  static Status check_keywords_apply(const json& s, const std::string& type,
                                     const std::string& path) {
    static const std::pair<const char*, const char*> kOwner[] = {
        {"properties", "object"}, {"required", "object"},  {"additionalProperties", "object"},
        {"items", "array"},       {"minItems", "array"},   {"maxItems", "array"},
        {"maxLength", "string"},  {"minLength", "string"}, {"pattern", "string"}};
    for (const auto& [key, owner] : kOwner) {
      if (s.contains(key) && type != owner) {
        return invalid_argument("JSON Schema keyword '" + std::string(key) + "' at " + path +
                                " applies to type " + owner + ", not " + type);
      }
    }
    return Status::ok();
  }

  static Result<int64_t> get_count(const json& s, const char* key, const std::string& path) {
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      std::string message = "'";
      message += key;
      message += "' at " + path + " must be a non-negative integer";
      return invalid_argument(std::move(message));
    }
    return v.get<int64_t>();
  }

  // A pair like minItems / maxItems; absent keys leave *min / *max as they are.
  static Status get_bounds(const json& s, const char* min_key, const char* max_key,
                           const std::string& path, int64_t* min, int64_t* max) {
    if (s.contains(min_key)) {
      ASSIGN_OR_RETURN(*min, get_count(s, min_key, path));
    }
    if (s.contains(max_key)) {
      ASSIGN_OR_RETURN(*max, get_count(s, max_key, path));
    }
    if (*max >= 0 && *max < *min) {
      return invalid_argument(std::string(max_key) + " is below " + min_key + " at " + path);
    }
    return Status::ok();
  }

  Result<int32_t> compile_type(const json& s, const std::string& type, const std::string& path,
                               int depth) {
    RETURN_IF_ERROR(check_keywords_apply(s, type, path));
    Node n;
    if (type == "object") {
      return compile_object(s, path, depth);
    }
    if (type == "array") {
      n.kind = NodeKind::kArray;
      n.items = Grammar::kAnyValue;
      if (s.contains("items")) {
        ASSIGN_OR_RETURN(n.items, compile(s["items"], path + ".items", depth + 1));
      }
      RETURN_IF_ERROR(get_bounds(s, "minItems", "maxItems", path, &n.min_items, &n.max_items));
    } else if (type == "string") {
      n.kind = NodeKind::kString;
      RETURN_IF_ERROR(get_bounds(s, "minLength", "maxLength", path, &n.min_length, &n.max_length));
      if (s.contains("pattern")) {
        ASSIGN_OR_RETURN(n.regex, compile_pattern(s["pattern"], path));
      }
    } else if (type == "integer") {
      n.kind = NodeKind::kInteger;
    } else if (type == "number") {
      n.kind = NodeKind::kNumber;
    } else if (type == "boolean") {
      n.kind = NodeKind::kLiteralSet;
      n.literals = {"true", "false"};
    } else if (type == "null") {
      n.kind = NodeKind::kLiteralSet;
      n.literals = {"null"};
    } else {
      return invalid_argument("unsupported JSON Schema type '" + type + "' at " + path);
    }
    return add_node(*g_, std::move(n));
  }

  Result<int32_t> compile_object(const json& s, const std::string& path, int depth) {
    Node n;
    n.kind = NodeKind::kObject;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        // Open objects with listed properties would need a key matcher that excludes them.
        if (!(ap.is_boolean() && ap.get<bool>() && !s.contains("properties"))) {
          return invalid_argument("unsupported JSON Schema keyword 'additionalProperties' at " +
                                  path + ": only false is supported (as in strict mode)");
        }
      }
    }
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty()) {
        return invalid_argument("'required' at " + path + " names properties not in 'properties'");
      }
      if (s.contains("additionalProperties") && !s["additionalProperties"].get<bool>()) {
        return add_node(*g_, std::move(n));  // {} only
      }
      return Grammar::kAnyObject;
    }
    const json& props = s["properties"];
    if (!props.is_object()) {
      return invalid_argument("'properties' at " + path + " must be an object");
    }
    if (props.size() > kMaxLiterals) {
      return invalid_argument("the object at " + path + " has more than " +
                              std::to_string(kMaxLiterals) + " properties");
    }
    for (const auto& [key, sub] : props.items()) {
      Property p;
      p.key = json(key).dump();
      p.key = p.key.substr(1, p.key.size() - 2);  // without the quotes
      ASSIGN_OR_RETURN(p.value, compile(sub, path + ".properties." + key, depth + 1));
      n.properties.push_back(std::move(p));
    }
    if (s.contains("required")) {
      const json& req = s["required"];
      if (!req.is_array()) {
        return invalid_argument("'required' at " + path + " must be an array of strings");
      }
      for (const json& r : req) {
        if (!r.is_string() || !props.contains(r.get<std::string>())) {
          return invalid_argument("'required' at " + path + " names " + r.dump() +
                                  ", which is not in 'properties'");
        }
        size_t i = 0;
        for (const auto& [key, sub] : props.items()) {
          if (key == r.get<std::string>()) {
            n.properties[i].is_required = true;
          }
          ++i;
        }
      }
    }
    return add_node(*g_, std::move(n));
  }

  Result<int32_t> compile_literals(const json& s, const std::string& path) {
    Node n;
    n.kind = NodeKind::kLiteralSet;
    if (s.contains("const")) {
      n.literals.push_back(s["const"].dump());
    } else {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty() || e.size() > kMaxLiterals) {
        return invalid_argument("'enum' at " + path + " must be an array of 1 to " +
                                std::to_string(kMaxLiterals) + " values");
      }
      for (const json& v : e) {
        n.literals.push_back(v.dump());
      }
    }
    return add_node(*g_, std::move(n));
  }

  // JSON Schema's `pattern` is a search, not a full match: unanchored ends match anything.
  // The string's content is the raw bytes between its quotes, so a pattern may not produce
  // '"', '\\' or control characters (they would need escaping): those bytes are cut from the
  // automaton, and a pattern left with no match is refused.
  static Result<std::shared_ptr<const RegexDfa>> compile_pattern(const json& pattern,
                                                                 const std::string& path) {
    if (!pattern.is_string()) {
      return invalid_argument("'pattern' at " + path + " must be a string");
    }
    std::string text = pattern.get<std::string>();
    const bool anchored_start = !text.empty() && text.front() == '^';
    size_t backslashes = 0;
    for (size_t i = text.size(); i-- > 1 && text[i - 1] == '\\';) {
      ++backslashes;
    }
    const bool anchored_end =
        text.size() > (anchored_start ? 1 : 0) && text.back() == '$' && backslashes % 2 == 0;
    if (anchored_end) {
      text.pop_back();
    }
    if (anchored_start) {
      text.erase(0, 1);
    }
    const std::string any = "[^\"\\\\\\x00-\\x1f]*";
    std::string wrapped =
        (anchored_start ? "" : any) + "(?:" + text + ")" + (anchored_end ? "" : any);
    auto dfa = compile_regex(wrapped);
    if (!dfa.is_ok()) {
      return invalid_argument("'pattern' at " + path + ": " + dfa.status().message());
    }
    auto escaped = without_escaped_bytes(**dfa);
    if (!escaped.is_ok()) {
      return invalid_argument("'pattern' at " + path + ": " + escaped.status().message());
    }
    return escaped;
  }

  Result<int32_t> compile_any_of(const json& list, const std::string& path, int depth) {
    if (!list.is_array() || list.empty()) {
      return invalid_argument(path + " must be a non-empty array of schemas");
    }
    Node n;
    n.kind = NodeKind::kAnyOf;
    for (size_t i = 0; i < list.size(); ++i) {
      ASSIGN_OR_RETURN(int32_t b,
                       compile(list[i], path + "[" + std::to_string(i) + "]", depth + 1));
      n.branches.push_back(b);
    }
    Status disjoint = check_disjoint(n, path);
    if (!disjoint.is_ok()) {
      std::optional<Node> tagged = tagged_union(n);
      if (!tagged.has_value()) {
        return disjoint;
      }
      return add_node(*g_, std::move(*tagged));
    }
    return add_node(*g_, std::move(n));
  }

  // Alternatives that are all objects told apart by a string constant in the same first,
  // required property: a kTaggedUnion. nullopt when they are not.
  std::optional<Node> tagged_union(const Node& any_of) const {
    Node n;
    n.kind = NodeKind::kTaggedUnion;
    for (int32_t b : any_of.branches) {
      const Node& branch = g_->nodes[b];
      if (branch.kind != NodeKind::kObject || branch.any_keys || branch.properties.empty() ||
          !branch.properties[0].is_required) {
        return std::nullopt;
      }
      const Node& tag = g_->nodes[branch.properties[0].value];
      if (tag.kind != NodeKind::kLiteralSet || tag.literals.size() != 1 ||
          tag.literals[0].size() < 2 || tag.literals[0][0] != '"') {
        return std::nullopt;
      }
      if (n.properties.empty()) {
        n.properties.push_back(branch.properties[0]);
      } else if (n.properties[0].key != branch.properties[0].key) {
        return std::nullopt;
      }
      // JSON strings end with their quote, so distinct constants never prefix each other.
      if (std::find(n.literals.begin(), n.literals.end(), tag.literals[0]) != n.literals.end()) {
        return std::nullopt;
      }
      n.literals.push_back(tag.literals[0]);
      n.branches.push_back(b);
    }
    if (n.branches.size() > static_cast<size_t>(kMaxLiterals)) {
      return std::nullopt;
    }
    return n;
  }

  // The matcher picks a branch by the first byte of the value, so branches must differ there.
  Status check_disjoint(const Node& n, const std::string& path) const {
    std::bitset<256> seen;
    for (int32_t b : n.branches) {
      if ((seen & g_->nodes[b].first_bytes).any()) {
        return invalid_argument("unsupported JSON Schema at " + path +
                                ": the alternatives must be values of different types "
                                "(told apart by their first character), or objects told apart "
                                "by a string constant in the same first required property");
      }
      seen |= g_->nodes[b].first_bytes;
    }
    return Status::ok();
  }

  Grammar* g_;
};

}  // namespace

int32_t add_node(Grammar& g, Node node) {
  node.first_bytes = first_bytes_of(g, node);
  g.nodes.push_back(std::move(node));
  return static_cast<int32_t>(g.nodes.size() - 1);
}

Grammar make_base_grammar() {
  Grammar g;
  Node any;
  CRESCENT_CHECK(add_node(g, any) == Grammar::kAnyValue);
  Node object;
  object.kind = NodeKind::kObject;
  object.any_keys = true;
  CRESCENT_CHECK(add_node(g, object) == Grammar::kAnyObject);
  Node array;
  array.kind = NodeKind::kArray;
  array.items = Grammar::kAnyValue;
  CRESCENT_CHECK(add_node(g, array) == Grammar::kAnyArray);
  Node string;
  string.kind = NodeKind::kString;
  CRESCENT_CHECK(add_node(g, string) == Grammar::kAnyString);
  Node number;
  number.kind = NodeKind::kNumber;
  CRESCENT_CHECK(add_node(g, number) == Grammar::kAnyNumber);
  Node literals;
  literals.kind = NodeKind::kLiteralSet;
  literals.literals = {"true", "false", "null"};
  CRESCENT_CHECK(add_node(g, literals) == Grammar::kTrueFalseNull);
  return g;
}

std::shared_ptr<const Grammar> compile_json_object() {
  auto g = std::make_shared<Grammar>(make_base_grammar());
  g->root = Grammar::kAnyObject;
  return g;
}

Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_json) {
  ASSIGN_OR_RETURN(json schema, parse_json<json>(schema_json, "the JSON Schema", kMaxDepth * 4));
  auto g = std::make_shared<Grammar>(make_base_grammar());
  SchemaCompiler compiler(g.get());
  ASSIGN_OR_RETURN(g->root, compiler.compile(schema, "$", 0));
  return std::shared_ptr<const Grammar>(std::move(g));
}

Result<std::shared_ptr<const Grammar>> compile_regex_text(std::string_view pattern) {
  ASSIGN_OR_RETURN(std::shared_ptr<const RegexDfa> dfa, compile_regex(pattern));
  auto g = std::make_shared<Grammar>(make_base_grammar());
  Node n;
  n.kind = NodeKind::kRegex;
  n.regex = std::move(dfa);
  g->root = add_node(*g, std::move(n));
  return std::shared_ptr<const Grammar>(std::move(g));
}

Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices) {
  if (choices.empty() || choices.size() > kMaxLiterals) {
    return invalid_argument("guided_choice must list 1 to " + std::to_string(kMaxLiterals) +
                            " strings");
  }
  auto g = std::make_shared<Grammar>(make_base_grammar());
  Node n;
  n.kind = NodeKind::kLiteralSet;
  for (const std::string& c : choices) {
    if (c.empty()) {
      return invalid_argument("guided_choice may not contain an empty string");
    }
    n.literals.push_back(c);
  }
  g->root = add_node(*g, std::move(n));
  return std::shared_ptr<const Grammar>(std::move(g));
}

Result<std::shared_ptr<const Grammar>> compile(const GuidedDecoding& guided) {
  switch (guided.kind) {
    case GuidedDecoding::Kind::kJsonObject:
      return compile_json_object();
    case GuidedDecoding::Kind::kJsonSchema:
      return compile_json_schema(guided.json_schema);
    case GuidedDecoding::Kind::kChoice:
      return compile_choice(guided.choices);
    case GuidedDecoding::Kind::kRegex:
      return compile_regex_text(guided.regex);
    case GuidedDecoding::Kind::kNone:
      break;
  }
  return invalid_argument("no guided decoding constraint to compile");
}

}  // namespace crescent::engine::guided
