// The whole benchmark against a small in-process OpenAI-shaped server on 127.0.0.1 (real
// sockets, real SSE) that fails requests on purpose, and the flag-value parsers.

#include "bench/bench_serve.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "bench/fake_openai_server.h"
#include "bench/openai_request.h"

namespace crescent::bench {
namespace {

using json = nlohmann::json;

std::string tokenizer_path() {
  return std::string(CRESCENT_SOURCE_DIR) + "/src/model/testdata/tokenizer/sp_bpe_tokenizer.json";
}

using Failure = FakeOpenAiServer::Failure;

std::unique_ptr<FakeOpenAiServer> start_fake(FakeOpenAiServer::FailurePolicy policy) {
  auto fake = FakeOpenAiServer::start(std::move(policy));
  EXPECT_TRUE(fake.is_ok()) << fake.status().to_string();
  return std::move(*fake);
}

// Every request the benchmark sent has vLLM's streamed body.
void expect_bench_bodies(const FakeOpenAiServer& server) {
  for (const auto& seen : server.seen_requests()) {
    json body = json::parse(seen.body);
    EXPECT_EQ(body["model"], "fake-model");
    EXPECT_EQ(body["stream"], true);
    EXPECT_EQ(body["stream_options"]["include_usage"], true);
    EXPECT_EQ(body["ignore_eos"], true);  // the random dataset always asks for it
    EXPECT_EQ(seen.request_id.rfind("bench-", 0), 0u) << seen.request_id;
  }
}

std::string read_all(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    text.append(buf, n);
  }
  return text;
}

BenchServeOptions small_run(int port) {
  BenchServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.tokenizer = tokenizer_path();
  o.random_input_len = 16;
  o.random_output_len = 4;
  o.num_prompts = 9;
  o.max_concurrency = 3;
  o.show_progress = false;
  o.request_timeout_s = 30;
  return o;
}

TEST(BenchServeTest, ServerFailingEveryThirdRequestIsCountedAndShown) {
  auto fake = start_fake([](int n) { return n % 3 == 0 ? Failure::kHttp500 : Failure::kNone; });
  FakeOpenAiServer& server = *fake;
  auto dir = std::filesystem::temp_directory_path() /
             ("crescent-bench-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  BenchServeOptions o = small_run(server.port());
  o.save_result = (dir / "result.json").string();
  o.goodput = {{"ttft", 60'000}};
  o.metric_percentiles = {50, 99.9};
  o.max_concurrency = 1;  // one at a time: request i is the server's #(i + 2)
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::string text = read_all(out);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string() << "\n" << text;
  // The test request is the server's #1; the run's nine are #2..#10: #3, #6, #9 fail.
  EXPECT_EQ(server.num_requests(), 10);
  expect_bench_bodies(server);
  const json& j = *r;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 3);
  EXPECT_EQ(j["total_input_tokens"], 6 * 5);  // usage.prompt_tokens of the completed ones
  EXPECT_EQ(j["total_output_tokens"], 6 * 4);
  EXPECT_EQ(j["model_id"], "fake-model");  // from GET /v1/models
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 1);
  ASSERT_EQ(j["first_errors"].size(), 3u);
  EXPECT_EQ(j["first_errors"][0]["error"], "HTTP 500 Internal Server Error: injected failure #3");
  EXPECT_EQ(j["first_errors"][1]["request"], 4);
  EXPECT_EQ(j["first_errors"][2]["request"], 7);
  EXPECT_TRUE(j.contains("p50_ttft_ms"));
  EXPECT_TRUE(j.contains("p99.9_itl_ms"));
  EXPECT_TRUE(j.contains("mean_e2el_ms"));
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), j["request_throughput"].get<double>());
  EXPECT_EQ(j["good_requests"], 6);
  EXPECT_EQ(j["slo_met_requests"]["ttft"], 6);

  EXPECT_NE(text.find("Failed requests:                         3"), std::string::npos) << text;
  EXPECT_NE(text.find("Successful requests:                     6"), std::string::npos) << text;
  EXPECT_NE(text.find("Error 0 (request 1): HTTP 500 Internal Server Error: injected failure #3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(text.find("P99.9 ITL (ms):"), std::string::npos);

  std::ifstream saved(o.save_result);
  json from_file = json::parse(saved);
  EXPECT_EQ(from_file["failed"], 3);
  EXPECT_EQ(from_file["completed"], 6);
  std::ifstream svg(dir / "result.svg");
  std::stringstream ss;
  ss << svg.rdbuf();
  EXPECT_EQ(ss.str().rfind("<?xml", 0), 0u);
  EXPECT_NE(ss.str().find("3 failed"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(BenchServeTest, ErrorEventMidStreamFailsTheRequestOnChat) {
  auto fake = start_fake(
      [](int n) { return n % 2 == 0 ? Failure::kErrorEventAfterFirstToken : Failure::kNone; });
  FakeOpenAiServer& server = *fake;
  BenchServeOptions o = small_run(server.port());
  o.backend = "openai-chat";
  o.endpoint = "/v1/chat/completions";
  o.served_model_name = "fake-model";
  o.num_prompts = 6;
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::string text = read_all(out);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string() << "\n" << text;
  // Server #1 is the test request; #2, #4, #6 of the run's #2..#7 fail after one token.
  EXPECT_EQ((*r)["completed"], 3);
  EXPECT_EQ((*r)["failed"], 3);
  EXPECT_EQ((*r)["first_errors"][0]["error"], "error event in stream: generation failed: injected");
  EXPECT_EQ((*r)["total_output_tokens"], 3 * 4);
  EXPECT_EQ(server.num_requests(), 7);
  expect_bench_bodies(server);
  for (const auto& seen : server.seen_requests()) {
    EXPECT_EQ(seen.path, "/v1/chat/completions");
    EXPECT_EQ(json::parse(seen.body)["messages"][0]["role"], "user");
  }
}

TEST(BenchServeTest, FailingTestRequestStopsTheRun) {
  auto fake = start_fake([](int) { return Failure::kHttp500; });
  FakeOpenAiServer& server = *fake;
  BenchServeOptions o = small_run(server.port());
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::fclose(out);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("Initial test run failed"), std::string::npos);
  EXPECT_NE(r.status().message().find("injected failure #1"), std::string::npos);
  EXPECT_EQ(server.num_requests(), 1);
}

TEST(BenchServeTest, NoServerIsAClearError) {
  int port = 0;
  {
    auto fake = start_fake(nullptr);  // a port that was just free
    port = fake->port();
  }
  BenchServeOptions o = small_run(port);
  o.served_model_name = "m";
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::fclose(out);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("cannot connect"), std::string::npos)
      << r.status().to_string();
}

TEST(BenchServeOptionsTest, ParsesFlagValues) {
  auto g = parse_goodput("ttft:100 tpot:50,e2el:2000");
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(*g, (GoodputSlos{{"ttft", 100}, {"tpot", 50}, {"e2el", 2000}}));
  EXPECT_FALSE(parse_goodput("ttft=100").is_ok());
  EXPECT_EQ(*parse_goodput("itl:200"), (GoodputSlos{{"itl", 200}}));  // crescent's extension
  EXPECT_FALSE(parse_goodput("p99_itl:5").is_ok());
  EXPECT_FALSE(parse_goodput("ttft:-1").is_ok());
  EXPECT_FALSE(parse_goodput("ttft:abc").is_ok());
  EXPECT_FALSE(parse_goodput("").is_ok());

  auto m = parse_percentile_metrics("ttft,e2el");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(*m, (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_FALSE(parse_percentile_metrics("ttft,latency").is_ok());

  auto p = parse_metric_percentiles("50,90,99.9");
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(*p, (std::vector<double>{50, 90, 99.9}));
  EXPECT_FALSE(parse_metric_percentiles("101").is_ok());
  EXPECT_FALSE(parse_metric_percentiles("x").is_ok());

  EXPECT_TRUE(std::isinf(*parse_request_rate("inf")));
  EXPECT_EQ(*parse_request_rate("2.5"), 2.5);
  EXPECT_FALSE(parse_request_rate("0").is_ok());
  EXPECT_FALSE(parse_request_rate("fast").is_ok());
}

TEST(BenchServeOptionsTest, ParsesBaseUrls) {
  auto a = parse_base_url("http://127.0.0.1:8000");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  EXPECT_EQ(a->path_prefix, "");
  a = parse_base_url("http://example.com/api/");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->host, "example.com");
  EXPECT_EQ(a->port, 80);
  EXPECT_EQ(a->path_prefix, "/api");
  a = parse_base_url("http://[::1]:9000/x");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 9000);
  EXPECT_FALSE(parse_base_url("https://example.com").is_ok());
  EXPECT_FALSE(parse_base_url("127.0.0.1:8000").is_ok());
  EXPECT_FALSE(parse_base_url("http://:80").is_ok());
  EXPECT_FALSE(parse_base_url("http://h:99999").is_ok());
  EXPECT_FALSE(parse_base_url("http://h:8x").is_ok());
}

TEST(BenchServeOptionsTest, ValidatesCombinations) {
  BenchServeOptions o;
  o.tokenizer = "t";
  EXPECT_TRUE(validate(o).is_ok());
  BenchServeOptions bad = o;
  bad.tokenizer = "";  // the server's /tokenize
  EXPECT_TRUE(validate(bad).is_ok());
  bad = o;
  bad.dataset_name = "sharegpt";
  EXPECT_NE(validate(bad).message().find("--dataset-path"), std::string::npos);
  bad = o;
  bad.dataset_path = "x.json";
  EXPECT_NE(validate(bad).message().find("drop --dataset-path"), std::string::npos);
  bad = o;
  bad.dataset_name = "sonnet";
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.endpoint = "/v1/embeddings";
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.backend = "tgi";
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.num_prompts = 0;
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.burstiness = 0;
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.extra_body_json = "[1]";
  EXPECT_FALSE(validate(bad).is_ok());
}

TEST(BenchServeOptionsTest, RandomMmNeedsTheChatEndpoint) {
  BenchServeOptions o;
  o.tokenizer = "t";
  o.dataset_name = "random-mm";
  o.endpoint = "/v1/chat/completions";
  EXPECT_TRUE(validate(o).is_ok()) << validate(o).to_string();
  BenchServeOptions bad = o;
  bad.endpoint = "/v1/completions";
  Status s = validate(bad);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("only the chat endpoint"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--endpoint /v1/chat/completions"), std::string::npos);
  bad = o;
  bad.dataset_path = "x.json";
  EXPECT_NE(validate(bad).message().find("drop --dataset-path"), std::string::npos);
  bad = o;
  bad.random_mm_image_limit = 0;  // base 1 image > limit 0
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.random_mm_num_mm_items_range_ratio = 2;
  EXPECT_FALSE(validate(bad).is_ok());
  bad = o;
  bad.random_mm_buckets.clear();
  EXPECT_FALSE(validate(bad).is_ok());
}

TEST(OpenAiRequestTest, ChatBodyCarriesTextThenImageParts) {
  SampleRequest r;
  r.prompt = "hello there";
  r.prompt_len = 2;
  r.expected_output_len = 7;
  r.image_urls = {"data:image/png;base64,AAAA", "data:image/png;base64,BBBB"};
  RequestOptions options;
  options.is_chat = true;
  options.model = "m";
  options.ignore_eos = true;
  json body = json::parse(request_body(r, options));
  ASSERT_EQ(body["messages"].size(), 1u);
  const json& message = body["messages"][0];
  EXPECT_EQ(message["role"], "user");
  ASSERT_TRUE(message["content"].is_array());
  ASSERT_EQ(message["content"].size(), 3u);
  EXPECT_EQ(message["content"][0], json({{"type", "text"}, {"text", "hello there"}}));
  EXPECT_EQ(message["content"][1],
            json({{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}}}}));
  EXPECT_EQ(message["content"][2]["image_url"]["url"], "data:image/png;base64,BBBB");
  EXPECT_EQ(body["max_completion_tokens"], 7);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_FALSE(body.contains("prompt"));

  // Without images the content stays a plain string, as before.
  r.image_urls.clear();
  body = json::parse(request_body(r, options));
  EXPECT_EQ(body["messages"][0]["content"], "hello there");
}

TEST(BenchServeTest, RandomMmSendsImagesAndCountsThem) {
  auto fake = start_fake(nullptr);
  FakeOpenAiServer& server = *fake;
  BenchServeOptions o = small_run(server.port());
  o.dataset_name = "random-mm";
  o.endpoint = "/v1/chat/completions";
  o.served_model_name = "fake-model";
  o.num_prompts = 8;
  o.random_mm_base_items_per_request = 2;
  o.random_mm_num_mm_items_range_ratio = 0.5;  // 1..3 images
  o.random_mm_buckets = {{20, 30, 0.5}, {14, 14, 0.5}};
  o.save_detailed = true;
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::string text = read_all(out);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string() << "\n" << text;
  EXPECT_EQ((*r)["completed"], 8);
  expect_bench_bodies(server);

  // The run's requests (the first seen is the test request) and the images they carried.
  auto seen = server.seen_requests();
  ASSERT_EQ(seen.size(), 9u);
  int64_t num_images = 0;
  std::set<std::string> urls;
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].path, "/v1/chat/completions");
    json content = json::parse(seen[i].body)["messages"][0]["content"];
    ASSERT_TRUE(content.is_array());
    EXPECT_EQ(content[0]["type"], "text");
    ASSERT_GE(content.size(), 2u);
    ASSERT_LE(content.size(), 4u);
    for (size_t k = 1; k < content.size(); ++k) {
      EXPECT_EQ(content[k]["type"], "image_url");
      std::string url = content[k]["image_url"]["url"];
      EXPECT_EQ(url.rfind("data:image/png;base64,iVBORw0KGgo", 0), 0u) << url.substr(0, 40);
      urls.insert(url);
      ++num_images;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(urls.size()), num_images);
  EXPECT_EQ((*r)["total_images_sent"], num_images);
  EXPECT_EQ((*r)["total_images_completed"], num_images);
  int64_t listed = 0;
  for (const json& n : (*r)["num_images"]) {
    listed += n.get<int64_t>();
  }
  EXPECT_EQ(listed, num_images);
  EXPECT_NE(text.find("Generated " + std::to_string(num_images) + " random images"),
            std::string::npos)
      << text;
  char row[128];
  std::snprintf(row, sizeof(row), "%-40s %-10lld",
                "Total images sent:", static_cast<long long>(num_images));
  EXPECT_NE(text.find(row), std::string::npos) << text;
  EXPECT_NE(text.find("Image throughput (img/s):"), std::string::npos);
}

TEST(BenchServeTest, TextRunsDoNotMentionImages) {
  auto fake = start_fake(nullptr);
  BenchServeOptions o = small_run(fake->port());
  o.served_model_name = "fake-model";
  o.num_prompts = 2;
  FILE* out = std::tmpfile();
  auto r = run_bench_serve(o, out, nullptr);
  std::string text = read_all(out);
  std::fclose(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(text.find("image"), std::string::npos) << text;
  EXPECT_FALSE(r->contains("total_images_sent"));
}

}  // namespace
}  // namespace crescent::bench
