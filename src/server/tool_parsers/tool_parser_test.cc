#include "server/tool_parsers/tool_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace crescent::server {
namespace {

using json = nlohmann::json;

std::unique_ptr<ToolParser> parser(std::string_view name) {
  auto p = make_tool_parser(name);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return std::move(p).value();
}

// A call as name + parsed arguments (ids are random).
std::vector<std::pair<std::string, json>> calls_of(const std::vector<ToolCall>& calls) {
  std::vector<std::pair<std::string, json>> out;
  for (const ToolCall& c : calls) {
    EXPECT_TRUE(c.id.starts_with("chatcmpl-tool-")) << c.id;
    out.emplace_back(c.name, json::parse(c.arguments));
  }
  return out;
}

struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
};

// Streams `text` in the pieces that `cuts` (ascending offsets) make.
Streamed stream(const ToolParser& p, std::string_view text, const std::vector<size_t>& cuts) {
  Streamed out;
  auto streamer = p.start_stream();
  auto take = [&](ToolStreamDelta d) {
    out.content += d.content;
    for (auto& c : d.calls) {
      out.calls.push_back(std::move(c));
    }
  };
  size_t begin = 0;
  for (size_t cut : cuts) {
    take(streamer->push(text.substr(begin, cut - begin)));
    begin = cut;
  }
  take(streamer->push(text.substr(begin)));
  take(streamer->finish());
  return out;
}

// Streaming split at every byte offset (and byte by byte) gives extract()'s answer.
void expect_stream_matches_extract(const ToolParser& p, std::string_view text) {
  const ExtractedToolCalls whole = p.extract(text);
  std::vector<std::vector<size_t>> splits = {{}};
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) {
    splits.push_back({i});
    every.push_back(i);
  }
  splits.push_back(every);
  for (const auto& cuts : splits) {
    const Streamed s = stream(p, text, cuts);
    const std::string where = "cut at " + (cuts.empty() ? "none" : std::to_string(cuts[0])) +
                              (cuts.size() > 1 ? " (every byte)" : "") +
                              " of: " + std::string(text);
    EXPECT_EQ(s.content, whole.content.value_or("")) << where;
    EXPECT_EQ(calls_of(s.calls), calls_of(whole.calls)) << where;
  }
}

TEST(HermesToolParserTest, ContentBeforeSeveralCalls) {
  auto p = parser("hermes");
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>";
  ExtractedToolCalls r = p->extract(text);
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // Re-serialized in the model's key order.
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_EQ(r.calls[0].id.size(), std::string("chatcmpl-tool-").size() + 32);
  expect_stream_matches_extract(*p, text);
}

TEST(HermesToolParserTest, BlankContentIsNull) {
  auto p = parser("hermes");
  const std::string text =
      "\n\n<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>\n";
  ExtractedToolCalls r = p->extract(text);
  EXPECT_FALSE(r.content.has_value());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x":1})");
  expect_stream_matches_extract(*p, text);
}

TEST(HermesToolParserTest, NestedAndUnicodeArguments) {
  auto p = parser("hermes");
  const std::string text =
      "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"who\": \"Zoë 東京 🚀\", \"opts\": "
      "{\"seats\": [1, 2, {\"row\": \"}{\\\"\"}], \"ok\": true, \"n\": null}}}\n</tool_call>";
  ExtractedToolCalls r = p->extract(text);
  ASSERT_EQ(r.calls.size(), 1u) << r.content.value_or("");
  const json args = json::parse(r.calls[0].arguments);
  EXPECT_EQ(args["who"], "Zoë 東京 🚀");
  EXPECT_EQ(args["opts"]["seats"][2]["row"], "}{\"");
  EXPECT_EQ(args["opts"]["ok"], true);
  EXPECT_NE(r.calls[0].arguments.find("Zoë 東京 🚀"), std::string::npos);  // not \u-escaped
  expect_stream_matches_extract(*p, text);
}

TEST(HermesToolParserTest, MalformedBlockLeavesEverythingAsContent) {
  auto p = parser("hermes");
  for (const std::string text : {
           "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>",
           "<tool_call>not json</tool_call> after",
           "<tool_call>{\"arguments\": {}}</tool_call>",                  // no name
           "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",  // not an object
           "<tool_call>{\"name\": \"f\"}</tool_call>",                    // no arguments
           "  <tool_call>",
       }) {
    ExtractedToolCalls r = p->extract(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    expect_stream_matches_extract(*p, text);
  }
}

TEST(HermesToolParserTest, PlainTextAndUnclosedLastBlock) {
  auto p = parser("hermes");
  for (const std::string text : {"", "  ", "just text < tool_call", "a <tool_cal", "<tool_"}) {
    EXPECT_EQ(p->extract(text).content, text);
    expect_stream_matches_extract(*p, text);
  }
  // The output stopped before </tool_call>: the block still counts, as in vLLM.
  const std::string text = "ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}\n";
  ExtractedToolCalls r = p->extract(text);
  EXPECT_EQ(r.content, "ok ");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_stream_matches_extract(*p, text);
  // Text between and after blocks is dropped.
  const std::string between =
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and then "
      "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call> bye";
  r = p->extract(between);
  EXPECT_FALSE(r.content.has_value());
  EXPECT_EQ(r.calls.size(), 2u);
  expect_stream_matches_extract(*p, between);
}

TEST(HermesToolParserTest, StreamingSendsContentAtOnceAndEachCallWhenItsBlockEnds) {
  auto p = parser("hermes");
  auto s = p->start_stream();
  EXPECT_EQ(s->push("Sure").content, "Sure");
  EXPECT_EQ(s->push(", <tool").content, ", ");  // "<tool" may be markup: held
  ToolStreamDelta d = s->push("_call>{\"name\": \"f\", ");
  EXPECT_TRUE(d.empty());
  d = s->push("\"arguments\": {\"q\": 1}}</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  EXPECT_TRUE(d.content.empty());
  EXPECT_TRUE(s->finish().empty());
  // A malformed second block: the first call stays sent, the rest is content.
  s = p->start_stream();
  d = s->push("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{oops}");
  EXPECT_EQ(d.calls.size(), 1u);
  d = s->finish();
  EXPECT_EQ(d.content, "<tool_call>{oops}");
}

TEST(Llama3JsonToolParserTest, OneOrSeveralCalls) {
  auto p = parser("llama3_json");
  for (const std::string text : {
           R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
           "  <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
           R"({"name": "get_weather", "arguments": {"city": "Paris"}})",
       }) {
    ExtractedToolCalls r = p->extract(text);
    EXPECT_FALSE(r.content.has_value()) << text;
    ASSERT_EQ(r.calls.size(), 1u) << text;
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
    expect_stream_matches_extract(*p, text);
  }
  const std::string several =
      "{\"name\": \"a\", \"parameters\": {\"x\": {\"y\": [1, \"; }\"]}}}; {\"name\": \"b\", "
      "\"parameters\": {\"s\": \"ünï\"}};\n";
  ExtractedToolCalls r = p->extract(several);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(json::parse(r.calls[0].arguments)["x"]["y"][1], "; }");
  EXPECT_EQ(json::parse(r.calls[1].arguments)["s"], "ünï");
  expect_stream_matches_extract(*p, several);
}

TEST(Llama3JsonToolParserTest, AnythingElseIsContent) {
  auto p = parser("llama3_json");
  for (const std::string text : {
           "",
           "   ",
           "The weather is fine.",
           "Here: {\"name\": \"f\", \"parameters\": {}}",
           "{\"name\": \"f\", \"parameters\": {}} and some words",  // text after the call
           "{\"name\": \"f\", \"parameters\": {\"x\": }}",          // bad JSON
           "{\"city\": \"Paris\"}",                                 // not a call
           "{\"name\": \"f\", \"parameters\": {}",                  // unfinished
           "<|python_tag|>print(1)",
           "<|python_",
       }) {
    ExtractedToolCalls r = p->extract(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    expect_stream_matches_extract(*p, text);
  }
}

// Random texts built from markup pieces, streamed in random pieces: no crash, and whenever
// extract() finds calls (so all markup was well-formed) or streaming sends none, the two
// agree. (They may differ only when a call was sent before later markup turned out bad.)
TEST(ToolParserTest, RandomMarkupStreamsLikeExtract) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "<tool_",
                                           "call>",
                                           "<|python_tag|>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"name\"",
                                           "\"arguments\"",
                                           "\"parameters\"",
                                           ":",
                                           ",",
                                           ";",
                                           " ",
                                           "\n",
                                           "\"f\"",
                                           "\"",
                                           "\\",
                                           "1",
                                           "x",
                                           "é",
                                           "{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}",
                                           "{\"name\": \"g\", \"parameters\": {}}"};
  uint64_t x = 88172645463325252ull;
  auto next = [&](uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x % n;
  };
  int num_with_calls = 0;
  for (const char* name : {"hermes", "llama3_json"}) {
    auto p = parser(name);
    for (int i = 0; i < 3000; ++i) {
      std::string text;
      const uint64_t n = next(12);
      for (uint64_t k = 0; k < n; ++k) {
        text += pieces[next(pieces.size())];
      }
      // Half the time: well-formed calls in this parser's format after that text (hermes) or
      // instead of it (llama3_json), then maybe one more random piece.
      if (next(2) == 0) {
        const std::string ws[] = {"", " ", "\n", "\n\n "};
        const uint64_t num_calls = 1 + next(3);
        if (std::string_view(name) == "hermes") {
          for (uint64_t k = 0; k < num_calls; ++k) {
            text += "<tool_call>" + ws[next(4)] + pieces[pieces.size() - 1 - next(2)] +
                    ws[next(4)] + "</tool_call>" + ws[next(4)];
          }
        } else {
          text = ws[next(4)] + (next(2) == 0 ? "<|python_tag|>" : "");
          for (uint64_t k = 0; k < num_calls; ++k) {
            text += (k > 0 ? ";" + ws[next(4)] : "") + pieces[pieces.size() - 1 - next(2)];
          }
          text += next(2) == 0 ? ";" : ws[next(4)];
        }
        if (next(4) == 0) {
          text += pieces[next(pieces.size())];
        }
      }
      std::vector<size_t> cuts;
      for (size_t at = 1; at < text.size(); at += 1 + next(6)) {
        cuts.push_back(at);
      }
      const ExtractedToolCalls whole = p->extract(text);
      const Streamed streamed = stream(*p, text, cuts);
      if (!whole.calls.empty() || streamed.calls.empty()) {
        EXPECT_EQ(streamed.content, whole.content.value_or("")) << name << ": " << text;
        EXPECT_EQ(calls_of(streamed.calls), calls_of(whole.calls)) << name << ": " << text;
      }
      num_with_calls += whole.calls.empty() ? 0 : 1;
    }
  }
  EXPECT_GT(num_with_calls, 1000);  // the pieces make calls often enough to test something
}

TEST(ToolParserTest, UnknownNameIsAnError) {
  auto p = make_tool_parser("mistral");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("hermes, llama3_json"), std::string::npos);
}

}  // namespace
}  // namespace crescent::server
