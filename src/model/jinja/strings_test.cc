#include "model/jinja/strings.h"

#include <gtest/gtest.h>

namespace crescent::model::jinja {
namespace {

TEST(JinjaStringsTest, Strip) {
  EXPECT_EQ(py_strip("  a b \n", std::nullopt, true, true), "a b");
  EXPECT_EQ(py_strip("\xC2\xA0x\xE3\x80\x80", std::nullopt, true, true), "x");
  EXPECT_EQ(py_strip("\n\nx\n", std::string("\n"), true, false), "x\n");
  EXPECT_EQ(py_strip("xyhixy", std::string("xy"), false, true), "xyhi");
}

TEST(JinjaStringsTest, Split) {
  EXPECT_EQ(py_split("  a  b c ", std::nullopt, -1), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(py_split("a</think>b</think>c", std::string("</think>"), -1),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(py_split("a,b,c", std::string(","), 1), (std::vector<std::string>{"a", "b,c"}));
  EXPECT_EQ(py_split("a b  c", std::nullopt, 1), (std::vector<std::string>{"a", "b  c"}));
}

TEST(JinjaStringsTest, CaseAndReplace) {
  EXPECT_EQ(py_title("hello wORLD-x"), "Hello World-X");
  EXPECT_EQ(py_capitalize("hELLO"), "Hello");
  EXPECT_EQ(py_upper("héllo wörld"), "HÉLLO WÖRLD");
  EXPECT_EQ(py_title("héllo wörld 1st"), "Héllo Wörld 1St");
  EXPECT_EQ(count_words("héllo, wörld 👋 a_b"), 3);
  EXPECT_EQ(py_replace("aaa", "a", "b", 2), "bba");
  EXPECT_EQ(py_replace("ab", "", "-", -1), "-a-b-");
  EXPECT_EQ(html_escape("<a href='x'>&</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;");
  EXPECT_EQ(utf8_chars("hé").size(), 2u);
}

}  // namespace
}  // namespace crescent::model::jinja
