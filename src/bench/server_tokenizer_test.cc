// The server's tokenizer over real sockets: the stand-in server's /tokenize and /detokenize in
// vLLM's and llama.cpp server's shapes, a server with neither, random prompts of exact lengths
// made through it, and a whole benchmark run with no local tokenizer.

#include "bench/server_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "bench/bench_serve.h"
#include "bench/dataset.h"
#include "bench/fake_openai_server.h"

namespace crescent::bench {
namespace {

using Dialect = FakeOpenAiServer::TokenizeDialect;

std::unique_ptr<FakeOpenAiServer> start_fake(Dialect dialect) {
  auto fake =
      FakeOpenAiServer::start([](int) { return FakeOpenAiServer::Failure::kNone; }, "fake-model");
  EXPECT_TRUE(fake.is_ok()) << fake.status().to_string();
  (*fake)->set_tokenize_dialect(dialect);
  return std::move(*fake);
}

ServerTokenizerOptions options_for(const FakeOpenAiServer& fake) {
  ServerTokenizerOptions o;
  o.address.host = "127.0.0.1";
  o.address.port = fake.port();
  o.model = "fake-model";
  o.timeout_s = 10;
  return o;
}

class ServerTokenizerTest : public ::testing::TestWithParam<Dialect> {};

TEST_P(ServerTokenizerTest, EncodesDecodesAndMakesExactRandomPrompts) {
  auto fake = start_fake(GetParam());
  auto tok = connect_server_tokenizer(options_for(*fake));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto ids = (*tok)->encode("ab", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{256, 'a', 'b'}));
  ids = (*tok)->encode("ab", /*add_special_tokens=*/false);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'a', 'b'}));
  std::vector<int32_t> hello = {'h', 'i', '!'};
  auto text = (*tok)->decode(hello);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(*text, "hi!");
  EXPECT_FALSE((*tok)->encode("\xff\xfe", false).is_ok()) << "invalid UTF-8 is refused here";

  // The text ids: the printable ASCII of the built-in text, each once, in order.
  auto text_ids = (*tok)->text_token_ids();
  ASSERT_TRUE(text_ids.is_ok());
  EXPECT_GE(text_ids->size(), 40u);  // 26 letters, capitals, 10 digits, space, punctuation
  EXPECT_TRUE(std::is_sorted(text_ids->begin(), text_ids->end()));
  for (int32_t id : *text_ids) {
    EXPECT_TRUE(id >= ' ' && id < 127) << id;
  }
  EXPECT_EQ((*tok)->offset_range(), static_cast<int64_t>(text_ids->size()));

  RandomDatasetOptions r;
  r.input_len = 41;  // minus the BOS the server adds: 40 bytes of text
  r.output_len = 3;
  r.prefix_len = 5;
  r.seed = 7;
  auto prompts = sample_random(**tok, 12, r);
  ASSERT_TRUE(prompts.is_ok()) << prompts.status().to_string();
  ASSERT_EQ(prompts->size(), 12u);
  for (const SampleRequest& p : *prompts) {
    EXPECT_EQ(p.prompt_len, 45);
    EXPECT_EQ(p.prompt.size(), 45u) << p.prompt;  // one byte per token
    EXPECT_EQ(p.prompt.substr(0, 5), (*prompts)[0].prompt.substr(0, 5)) << "the shared prefix";
  }
  EXPECT_GT(fake->num_tokenize_calls(), 12);
  EXPECT_EQ(fake->num_requests(), 0) << "tokenize calls are not generation requests";
}

INSTANTIATE_TEST_SUITE_P(Dialects, ServerTokenizerTest,
                         ::testing::Values(Dialect::kVllm, Dialect::kLlamaCpp),
                         [](const auto& info) {
                           return std::string(info.param == Dialect::kVllm ? "vllm" : "llama_cpp");
                         });

TEST(ServerTokenizerErrors, AServerWithoutTokenizeIsRefusedNamingTheFlag) {
  auto fake = start_fake(Dialect::kNone);
  auto tok = connect_server_tokenizer(options_for(*fake));
  ASSERT_FALSE(tok.is_ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tok.status().message().find("/tokenize"), std::string::npos)
      << tok.status().to_string();
  EXPECT_NE(tok.status().message().find("--tokenizer"), std::string::npos)
      << tok.status().to_string();
}

TEST(ServerTokenizerErrors, NoServerIsAnErrorNotAHang) {
  ServerTokenizerOptions o;
  o.address.host = "127.0.0.1";
  o.address.port = 1;
  o.timeout_s = 5;
  auto tok = connect_server_tokenizer(o);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("127.0.0.1:1"), std::string::npos)
      << tok.status().to_string();
}

TEST(ServerTokenizerRun, AWholeBenchmarkWithoutALocalTokenizer) {
  auto fake = start_fake(Dialect::kVllm);
  BenchServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(fake->port());
  o.random_input_len = 17;
  o.random_output_len = 4;
  o.num_prompts = 6;
  o.max_concurrency = 2;
  o.show_progress = false;
  o.request_timeout_s = 30;
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)["completed"], 6);
  EXPECT_EQ((*r)["failed"], 0);
  EXPECT_EQ((*r)["tokenizer_id"], o.base_url + "/tokenize");
  for (const FakeOpenAiServer::SeenRequest& seen : fake->seen_requests()) {
    auto body = nlohmann::json::parse(seen.body);
    EXPECT_EQ(body["prompt"].get<std::string>().size(), 16u) << "17 tokens minus the BOS";
  }
}

// --ready-check-timeout-sec: a server that never comes up ends the run after the timeout with
// an error naming the flag; a server that is up is not waited for.
TEST(ReadyCheck, WaitsUpToTheTimeoutThenNamesTheFlag) {
  BenchServeOptions o;
  o.base_url = "http://127.0.0.1:1";
  o.ready_check_timeout_s = 1.5;
  o.show_progress = false;
  FILE* out = std::tmpfile();
  auto start = std::chrono::steady_clock::now();
  auto r = run_bench_serve(o, out, nullptr);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fclose(out);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--ready-check-timeout-sec"), std::string::npos)
      << r.status().to_string();
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 10.0);

  auto fake = start_fake(Dialect::kVllm);
  o.base_url = "http://127.0.0.1:" + std::to_string(fake->port());
  o.ready_check_timeout_s = 30;
  o.num_prompts = 2;
  o.random_input_len = 9;
  o.random_output_len = 2;
  start = std::chrono::steady_clock::now();
  out = std::tmpfile();
  r = run_bench_serve(o, out, nullptr);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  o.ready_check_timeout_s = -1;
  EXPECT_EQ(validate(o).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::bench
