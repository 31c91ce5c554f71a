#include "engine/guided/regex.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "engine/guided/grammar.h"
#include "engine/guided/matcher.h"

namespace crescent::engine::guided {
namespace {

std::shared_ptr<const RegexDfa> dfa_of(std::string_view pattern) {
  auto dfa = compile_regex(pattern);
  EXPECT_TRUE(dfa.is_ok()) << pattern << ": " << dfa.status().message();
  return dfa.is_ok() ? *dfa : nullptr;
}

// Every pattern is also valid ECMAScript with the same meaning over ASCII, so std::regex is an
// independent oracle: the DFA must agree with it on every string tried.
TEST(RegexTest, AgreesWithStdRegexOnRandomStrings) {
  const char* patterns[] = {
      "abc",       "a|b|cd",      "(ab)*c",         "a+b?",        "[a-c]{2,4}",     "[^ab]*",
      "(a|bc){3}", "x{0,2}y{1,}", "\\d+(\\.\\d+)?", "\\w\\s\\W",   "(?:ab|a)(bc|c)", "[-a]+",
      "[a-]+b",    "a.c",         "(a*)*b",         "((a|b)c)+|d", "[\\d\\s]+",      "\\S\\D",
      "a{3}",      "(a?){2}b",    "[\\x41-\\x43]x", "a*?b+?",      "\\.\\*\\+\\?",   "()a",
  };
  const std::string alphabet = "abcdxy01 .*+?-]\nA";
  std::mt19937 rng(7);
  for (const char* pattern : patterns) {
    auto dfa = dfa_of(pattern);
    ASSERT_NE(dfa, nullptr);
    const std::regex oracle(pattern, std::regex::ECMAScript);
    int matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 7);
      for (int k = 0; k < len; ++k) {
        s += alphabet[rng() % alphabet.size()];
      }
      const bool expected = std::regex_match(s, oracle);
      ASSERT_EQ(dfa->matches(s), expected) << "pattern " << pattern << " on '" << s << "'";
      matched += expected ? 1 : 0;
    }
    // Strings built from the pattern's own letters: the random ones rarely match long patterns.
    EXPECT_EQ(dfa->matches(""), std::regex_match("", oracle)) << pattern;
    (void)matched;
  }
}

TEST(RegexTest, DotAndNegatedClassesMatchWholeUtf8CodePoints) {
  auto dot = dfa_of(".");
  ASSERT_NE(dot, nullptr);
  for (const char* s : {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xEF\xBF\xBF",
                        "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF", "\xEE\x80\x80"}) {
    EXPECT_TRUE(dot->matches(s)) << s;
  }
  for (const char* s : {"\n", "\x80", "\xC0\x80", "\xC3", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                        "\xE0\x80\x80", "ab"}) {
    EXPECT_FALSE(dot->matches(s)) << s;
  }
  auto not_e_acute = dfa_of("[^\u00e9a]+");
  ASSERT_NE(not_e_acute, nullptr);
  EXPECT_TRUE(not_e_acute->matches("b\xE2\x82\xAC\xC3\xA8"));
  EXPECT_FALSE(not_e_acute->matches("b\xC3\xA9"));
  EXPECT_FALSE(not_e_acute->matches("ba"));
  auto range = dfa_of("[\u00e0-\u00ff\u4e00-\u9fff]{2}");
  ASSERT_NE(range, nullptr);
  EXPECT_TRUE(range->matches("\xC3\xA0\xE4\xB8\x80"));
  EXPECT_FALSE(range->matches("\xC3\x9F\xE4\xB8\x80"));  // U+00DF is below the range
  auto literal = dfa_of("caf\u00e9|\\u00e9t\\xe9");
  ASSERT_NE(literal, nullptr);
  EXPECT_TRUE(literal->matches("caf\xC3\xA9"));
  EXPECT_TRUE(literal->matches("\xC3\xA9t\xC3\xA9"));
}

TEST(RegexTest, PythonOnlySyntax) {
  auto named = dfa_of("(?P<year>\\d{4})-(?P<month>\\d{2})");
  ASSERT_NE(named, nullptr);
  EXPECT_TRUE(named->matches("2026-11"));
  auto upto = dfa_of("a{,2}b");  // Python: 0 to 2
  ASSERT_NE(upto, nullptr);
  EXPECT_TRUE(upto->matches("b"));
  EXPECT_TRUE(upto->matches("aab"));
  EXPECT_FALSE(upto->matches("aaab"));
  auto brace = dfa_of("a{x}|{");  // not a quantifier: literal braces, as in Python
  ASSERT_NE(brace, nullptr);
  EXPECT_TRUE(brace->matches("a{x}"));
  EXPECT_TRUE(brace->matches("{"));
  auto anchored = dfa_of("^ab$");
  ASSERT_NE(anchored, nullptr);
  EXPECT_TRUE(anchored->matches("ab"));
}

TEST(RegexTest, RefusesWhatItCannotMatchExactly) {
  struct Case {
    const char* pattern;
    const char* message;
  };
  const Case cases[] = {
      {"a(?=b)", "unsupported regex syntax '(?=' (lookahead) at offset 1"},
      {"(?<=a)b", "lookbehind"},
      {"(?i)a", "inline flags"},
      {"(a)\\1", "backreference"},
      {"\\bword", "word boundary"},
      {"a++", "possessive"},
      {"a^b", "anchor other than at the pattern's ends"},
      {"*a", "nothing to repeat at offset 0"},
      {"a**", "multiple repeat at offset 2"},
      {"(ab", "missing ')' at offset 3"},
      {"ab)", "unbalanced ')' at offset 2"},
      {"[ab", "unterminated character set"},
      {"[z-a]", "bad character range"},
      {"a{1001}", "over 1000"},
      {"a{3,2}", "min repeat greater than max repeat"},
      {"\\q", "bad escape"},
      {"\\ud800", "not a Unicode scalar value"},
      {"[^\\x00-\\U0010ffff]", "matches no text"},
      {"(a|b)*a(a|b){12}", "over 4096 DFA states"},
      {"(((a{1000}){1000}))", "too large"},
      {"\xC3", "not valid UTF-8"},
  };
  for (const Case& c : cases) {
    auto dfa = compile_regex(c.pattern);
    ASSERT_FALSE(dfa.is_ok()) << c.pattern;
    EXPECT_NE(dfa.status().message().find(c.message), std::string::npos)
        << c.pattern << " -> " << dfa.status().message();
  }
}

TEST(RegexTest, MatcherWalksTheAutomatonAndClosesAFullMatch) {
  auto g = compile_regex_text("(yes|no)!?");
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  Matcher m(*g);
  EXPECT_FALSE(m.is_accepting());
  EXPECT_FALSE(Matcher(m).advance('x'));
  ASSERT_TRUE(m.advance(std::string_view("yes")));
  EXPECT_TRUE(m.is_accepting());  // may end here, or add '!'
  EXPECT_FALSE(m.is_complete());
  ASSERT_TRUE(m.advance('!'));
  EXPECT_TRUE(m.is_complete());  // nothing may follow a full match with no way on
  EXPECT_FALSE(m.advance('!'));

  GuidedDecoding guided;
  guided.kind = GuidedDecoding::Kind::kRegex;
  guided.regex = "\\d{3}";
  auto compiled = compile(guided);
  ASSERT_TRUE(compiled.is_ok());
  Matcher digits(*compiled);
  EXPECT_TRUE(digits.advance(std::string_view("123")));
  EXPECT_TRUE(digits.is_complete());
}

TEST(RegexTest, JsonSchemaPatternIsASearchOverUnescapedContent) {
  auto g = compile_json_schema(
      R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}\\d+$"},)"
      R"("tag":{"type":"string","pattern":"ok"}},"required":["id","tag"]})");
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  auto accepts = [&](std::string_view text) {
    Matcher m(*g);
    return m.advance(text) && m.is_accepting();
  };
  EXPECT_TRUE(accepts(R"({"id":"AB12","tag":"ok"})"));
  EXPECT_TRUE(accepts(R"({"id":"XY7","tag":"not ok at all"})"));  // unanchored: a search
  EXPECT_FALSE(accepts(R"({"id":"AB","tag":"ok"})"));
  EXPECT_FALSE(accepts(R"({"id":"ab12","tag":"ok"})"));
  EXPECT_FALSE(accepts(R"({"id":"AB12","tag":"o k"})"));
  EXPECT_FALSE(accepts(R"({"id":"AB12","tag":"ok\"")"));  // no escapes in a pattern string

  // A pattern that only escaped characters could satisfy is refused, not ignored.
  auto quote = compile_json_schema(R"({"type":"string","pattern":"^\"$"})");
  ASSERT_FALSE(quote.is_ok());
  EXPECT_NE(quote.status().message().find("'pattern' at $: the regex matches no text"),
            std::string::npos)
      << quote.status().message();
}

}  // namespace
}  // namespace crescent::engine::guided
