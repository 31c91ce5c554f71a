#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/guided/grammar.h"
#include "engine/guided/matcher.h"
#include "engine/guided/vocab_trie.h"

namespace crescent::engine::guided {
namespace {

std::shared_ptr<const Grammar> schema(const std::string& text) {
  auto g = compile_json_schema(text);
  EXPECT_TRUE(g.is_ok()) << text << ": " << g.status().to_string();
  return g.is_ok() ? *g : compile_json_object();
}

// Whether `text` is a complete value of the grammar.
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.advance(text) && m.is_accepting();
}

// Whether `text` can begin a value of the grammar.
bool accepts_prefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.advance(text);
}

TEST(GuidedMatcherTest, JsonObjectAcceptsObjectsOnly) {
  auto g = compile_json_object();
  for (const char* ok : {R"({})", R"({"a":1})", R"({"a": [1, 2.5e-3, "x", true, null, {}]})",
                         R"({ "k" : {"n": false} })", R"({"s":"a\"b\\c\u00e9\n"})",
                         R"({"neg":-0.5,"e":1E+9})", "{\"u\":\"\xc3\xa9\"}"}) {
    EXPECT_TRUE(accepts(g, ok)) << ok;
  }
  for (const char* bad :
       {"[]", "1", R"("s")", R"({"a":01})", R"({"a":1,})", R"({a:1})", R"({"a":tru})",
        R"({"a":1})"
        " ",
        R"({"a":"\x"})", R"({"a":.5})", "{\"a\":\"\n\"}", R"({"a":-})"}) {
    EXPECT_FALSE(accepts(g, bad)) << bad;
  }
  EXPECT_TRUE(accepts_prefix(g, R"({"a": [1, {"b": "c)"));
  EXPECT_FALSE(accepts(g, R"({"a": [1, {"b": "c)"));
}

TEST(GuidedMatcherTest, WhitespaceIsBounded) {
  auto g = compile_json_object();
  EXPECT_TRUE(accepts(g, "{    \"a\":1}"));
  EXPECT_FALSE(accepts_prefix(g, "{     "));
  EXPECT_FALSE(accepts_prefix(g, " {"));  // nothing before the value
}

TEST(GuidedMatcherTest, TopLevelNumberEndsTheValue) {
  auto g = schema(R"({"type": "number"})");
  EXPECT_TRUE(accepts(g, "-12.5e3"));
  EXPECT_TRUE(accepts(g, "0"));
  EXPECT_FALSE(accepts(g, "1."));
  EXPECT_FALSE(accepts(g, "1e"));
  EXPECT_FALSE(accepts_prefix(g, "00"));
  EXPECT_FALSE(accepts_prefix(g, "1 "));
  auto i = schema(R"({"type": "integer"})");
  EXPECT_TRUE(accepts(i, "-42"));
  EXPECT_FALSE(accepts_prefix(i, "4.2"));
  EXPECT_FALSE(accepts_prefix(i, "4e2"));
  EXPECT_FALSE(accepts_prefix(i, std::string(kMaxNumberBytes + 1, '9')));
}

TEST(GuidedMatcherTest, ObjectSchemaFollowsPropertiesInOrder) {
  auto g = schema(R"({"type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"]})");
  EXPECT_TRUE(accepts(g, R"({"name": "Ann", "age": 3})"));
  EXPECT_TRUE(accepts(g, R"({"name":"Ann","age":3,"tags":["x","y"]})"));
  EXPECT_FALSE(accepts(g, R"({"name": "Ann"})"));            // age is required
  EXPECT_FALSE(accepts(g, R"({"age": 3, "name": "Ann"})"));  // order of properties
  EXPECT_FALSE(accepts(g, R"({"name": "Ann", "age": 3, "x": 1})"));
  EXPECT_FALSE(accepts(g, R"({"name": 1, "age": 3})"));
  EXPECT_FALSE(accepts(g, R"({"name": "Ann", "age": 3.5})"));
  EXPECT_FALSE(accepts(g, R"({})"));
  EXPECT_FALSE(accepts_prefix(g, R"({"nam ")"));
}

TEST(GuidedMatcherTest, OptionalPropertiesMaySkip) {
  auto g = schema(R"({"properties": {"a": {"type": "null"}, "b": {"type": "boolean"},
                                     "c": {"const": 7}}, "required": ["c"]})");
  EXPECT_TRUE(accepts(g, R"({"c": 7})"));
  EXPECT_TRUE(accepts(g, R"({"b": false, "c": 7})"));
  EXPECT_TRUE(accepts(g, R"({"a": null, "b": true, "c": 7})"));
  EXPECT_FALSE(accepts(g, R"({"c": 8})"));
  EXPECT_FALSE(accepts(g, R"({"a": null})"));
  auto none = schema(R"({"properties": {"a": {"type": "null"}}})");
  EXPECT_TRUE(accepts(none, "{}"));
  EXPECT_TRUE(accepts(none, R"({"a":null})"));
}

TEST(GuidedMatcherTest, StringLengthAndEnum) {
  auto g = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(accepts(g, R"("ab")"));
  EXPECT_TRUE(accepts(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));  // 3 code points
  EXPECT_TRUE(accepts(g, R"("a\nb")"));
  EXPECT_FALSE(accepts(g, R"("a")"));
  EXPECT_FALSE(accepts_prefix(g, R"("abcd)"));
  // Only valid UTF-8: no stray continuation byte, no cut character before the quote.
  auto any = schema(R"({"type": "string"})");
  EXPECT_TRUE(accepts(any, "\"\xe4\xb8\xad\""));
  EXPECT_FALSE(accepts_prefix(any, "\"\x80"));
  EXPECT_FALSE(accepts_prefix(any, "\"\xe4\xb8\""));
  EXPECT_FALSE(accepts_prefix(any, "\"\xc0\xaf"));
  auto e = schema(R"({"enum": ["red", "green", 3, null]})");
  EXPECT_TRUE(accepts(e, R"("red")"));
  EXPECT_TRUE(accepts(e, "3"));
  EXPECT_TRUE(accepts(e, "null"));
  EXPECT_FALSE(accepts(e, R"("blue")"));
  EXPECT_FALSE(accepts_prefix(e, R"("re ")"));
}

TEST(GuidedMatcherTest, ArrayBounds) {
  auto g = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
                      "maxItems": 2})");
  EXPECT_TRUE(accepts(g, "[1]"));
  EXPECT_TRUE(accepts(g, "[1, 2]"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts_prefix(g, "[1,2,"));
  EXPECT_FALSE(accepts(g, R"(["a"])"));
}

TEST(GuidedMatcherTest, AnyOfAndTypeLists) {
  auto g = schema(R"({"anyOf": [{"type": "string"}, {"type": "integer"},
                                {"type": "object", "properties": {"x": {"type": "null"}}}]})");
  EXPECT_TRUE(accepts(g, R"("s")"));
  EXPECT_TRUE(accepts(g, "5"));
  EXPECT_TRUE(accepts(g, R"({"x": null})"));
  EXPECT_FALSE(accepts(g, "true"));
  auto t = schema(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(accepts(t, "null"));
  EXPECT_TRUE(accepts(t, R"("a")"));
  EXPECT_FALSE(accepts(t, "1"));
}

// Objects told apart by a string constant in the same first property: the constant written
// picks the branch, so each tag carries only its own properties (forced tool calls).
TEST(GuidedMatcherTest, TaggedUnionTiesTheTagToItsBranch) {
  auto g = schema(R"({"type": "array", "minItems": 1, "items": {"anyOf": [
      {"type": "object", "properties": {"name": {"const": "get"}, "x": {"type": "integer"}},
       "required": ["name", "x"]},
      {"type": "object", "properties": {"name": {"enum": ["get_all"]},
       "y": {"type": "string"}}, "required": ["name"]}]}})");
  for (const char* ok :
       {R"([{"name":"get","x":1}])", R"([{"name":"get_all","y":"s"}])",
        R"([{ "name" : "get_all" }])", R"([{"name":"get","x":-2}, {"name":"get_all"}])"}) {
    EXPECT_TRUE(accepts(g, ok)) << ok;
  }
  for (const char* bad :
       {R"([{"name":"get","y":"s"}])", R"([{"name":"get_all","x":1}])", R"([{"name":"get"}])",
        R"([{"name":"put","x":1}])", R"([{"x":1,"name":"get"}])", R"([{"name":"ge","x":1}])"}) {
    EXPECT_FALSE(accepts(g, bad)) << bad;
  }
  // Not a tagged union (same constant twice; a non-string tag): refused as before.
  for (const char* refused :
       {R"({"anyOf": [{"properties": {"t": {"const": "a"}}, "required": ["t"]},
                      {"properties": {"t": {"const": "a"}}, "required": ["t"]}]})",
        R"({"anyOf": [{"properties": {"t": {"const": 1}}, "required": ["t"]},
                      {"properties": {"t": {"const": 12}}, "required": ["t"]}]})",
        R"({"anyOf": [{"properties": {"t": {"const": "a"}}},
                      {"properties": {"t": {"const": "b"}}}]})"}) {
    auto r = compile_json_schema(refused);
    ASSERT_FALSE(r.is_ok()) << refused;
    EXPECT_NE(r.status().message().find("different types"), std::string::npos);
  }
}

TEST(GuidedMatcherTest, ChoiceIsRawText) {
  auto g = compile_choice({"yes", "no", "not sure"});
  ASSERT_TRUE(g.is_ok());
  EXPECT_TRUE(accepts(*g, "yes"));
  EXPECT_TRUE(accepts(*g, "not sure"));
  EXPECT_FALSE(accepts(*g, "n"));
  EXPECT_FALSE(accepts_prefix(*g, "yes!"));
  EXPECT_FALSE(compile_choice({}).is_ok());
}

TEST(GuidedSchemaTest, UnsupportedKeywordsNameThemselves) {
  struct Case {
    const char* schema;
    const char* message;
  };
  const Case cases[] = {
      {R"x({"type": "string", "pattern": "a(?!b)"})x", "'pattern' at $: unsupported regex"},
      {R"({"type": "integer", "pattern": "1"})", "'pattern' at $ applies to type string"},
      {R"({"properties": {"a": {"type": "string", "format": "date"}}})",
       "'format' at $.properties.a"},
      {R"({"$ref": "#/$defs/x"})", "'$ref' at $"},
      {R"({"type": "integer", "minimum": 0})", "'minimum' at $"},
      {R"({"properties": {"a": {}}, "additionalProperties": true})", "additionalProperties"},
      {R"({"type": "integer", "maxLength": 3})", "'maxLength' at $ applies to type string"},
      {R"({"type": "date"})", "type 'date'"},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})", "different types"},
      {R"({"properties": {"a": {}}, "required": ["b"]})", "\"b\""},
      {R"({"type": "array", "minItems": 3, "maxItems": 1})", "maxItems"},
      {"[1]", "must be an object"},
      {"{", "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto g = compile_json_schema(c.schema);
    ASSERT_FALSE(g.is_ok()) << c.schema;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.message), std::string::npos)
        << c.schema << " -> " << g.status().message();
  }
}

// The trie walk's allowed set equals trying every token's bytes on a copy of the matcher.
TEST(GuidedVocabTrieTest, AllowedSetEqualsBruteForce) {
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":, \n0123456789.-eEabnlrstufx\\";
  std::vector<std::string> vocab = {
      "",     "{", "}",  "\"", "{\"", "\":", "\": ", ",",   ", \"", "true",
      "null", "1", "12", "0.", "e5",  "\"a", "ab",   "\\n", " "};
  for (int i = 0; i < 400; ++i) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 5);
    for (int j = 0; j < len; ++j) {
      t.push_back(alphabet[rng() % alphabet.size()]);
    }
    vocab.push_back(t);
  }
  for (const char* t : {"\xc3\xa9", "\xc3", "\xa9", "a\xe4\xb8", "\xad\"", "\xe4\xb8\xad"}) {
    vocab.emplace_back(t);
  }
  vocab.push_back(vocab[5]);  // a duplicate
  VocabTrie trie(vocab);
  // b's maxLength walks the whole trie; s's free string takes the fast path.
  auto g = schema(R"({"type": "object", "properties": {"a": {"type": "array",
      "items": {"type": "number"}}, "b": {"type": "string", "maxLength": 4},
      "s": {"type": "string"}}, "required": ["b", "s"]})");
  bool saw_free_string = false;
  // A root regex takes the DFA walk; it must allow exactly what the matcher does.
  auto regex = compile_regex_text("[a-u0-9\"{}]{1,12}(\\.|e5)|\u00e9+(x\u4e2d)?");
  ASSERT_TRUE(regex.is_ok()) << regex.status().message();
  const std::pair<std::shared_ptr<const Grammar>, const char*> cases[] = {
      {g, ""}, {g, R"({"b": "ab", "s": ")"}, {*regex, ""}, {*regex, "\xc3\xa9"}};
  for (const auto& [grammar, start] : cases) {
    Matcher m(grammar);
    ASSERT_TRUE(m.advance(start));
    std::vector<int32_t> allowed;
    for (int step = 0; step < 40; ++step) {
      saw_free_string = saw_free_string || m.is_in_free_string();
      trie.allowed_tokens(m, &allowed);
      std::vector<int32_t> expected;
      for (size_t id = 0; id < vocab.size(); ++id) {
        Matcher copy = m;
        if (!vocab[id].empty() && copy.advance(vocab[id])) {
          expected.push_back(static_cast<int32_t>(id));
        }
      }
      std::sort(allowed.begin(), allowed.end());
      ASSERT_EQ(allowed, expected) << "step " << step;
      if (allowed.empty()) {
        break;
      }
      ASSERT_TRUE(m.advance(vocab[allowed[rng() % allowed.size()]]));
    }
  }
  EXPECT_TRUE(saw_free_string);
}

}  // namespace
}  // namespace crescent::engine::guided
