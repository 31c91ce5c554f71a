// `crescent serve` on the tiny model, over 127.0.0.1: the same greedy text whichever way it is
// asked for, right usage counts, /metrics that parses and passes promtool (Prometheus's linter),
// the bad-input table, 256 concurrent streams with the KV cache back to zero, a client that
// leaves, and the SIGTERM drain.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "net/http/http_client.h"
#include "server/serve_process.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;

// Generous: 256 concurrent streams on an ASan build of a loaded 2-core machine took over 20 s.
// Only a hang waits this long.
Deadline soon() {
  return Deadline::after_ms(90'000);
}

constexpr int kMaxModelLen = 256;

std::vector<std::string> serve_args() {
  return {"--model",
          ensure_test_model("tiny"),
          "--served-model-name",
          "tiny",
          "--threads",
          "1",
          "--max-model-len",
          std::to_string(kMaxModelLen),
          "--max-num-seqs",
          "256",
          "--kv-cache-mb",
          "64"};
}

struct Streamed {
  int status = 0;
  std::string text;
  json usage;
  json finish_reason;
  int num_events = 0;
  bool done = false;
};

Streamed stream(HttpClient& client, const std::string& path, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Streamed out;
  net::http::SseParser sse;
  auto r = client.stream(
      "POST", path, body.dump(), {{"Content-Type", "application/json"}},
      [&](std::string_view d) {
        sse.feed(d, [&](std::string_view e) {
          if (e == "[DONE]") {
            out.done = true;
            return;
          }
          EXPECT_FALSE(out.done) << "event after [DONE]";
          json j = json::parse(e);
          ++out.num_events;
          if (j["usage"].is_object()) {
            out.usage = j["usage"];
          }
          if (j["choices"].empty()) {
            return;
          }
          const json& c = j["choices"][0];
          if (c.contains("text")) {
            out.text += c["text"].get<std::string>();
          } else if (c["delta"].contains("content")) {
            out.text += c["delta"]["content"].get<std::string>();
          }
          if (!c["finish_reason"].is_null()) {
            out.finish_reason = c["finish_reason"];
          }
        });
        return true;
      },
      soon());
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  out.status = r.is_ok() ? r->status : 0;
  return out;
}

json post_json(HttpClient& client, const std::string& path, const json& body, int* status) {
  auto r =
      client.request("POST", path, body.dump(), {{"Content-Type", "application/json"}}, soon());
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  *status = r.is_ok() ? r->status : 0;
  return r.is_ok() ? json::parse(r->body, nullptr, false) : json();
}

// name{labels} -> value, for every sample line; fails the test on a line it cannot parse.
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    auto space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    if (space == std::string::npos) {
      continue;
    }
    size_t used = 0;
    double v = std::stod(line.substr(space + 1), &used);
    EXPECT_EQ(used, line.size() - space - 1) << line;
    samples[line.substr(0, space)] = v;
  }
  return samples;
}

std::map<std::string, double> metrics(HttpClient& client) {
  auto r = client.request("GET", "/metrics", "", {}, soon());
  EXPECT_TRUE(r.is_ok());
  EXPECT_EQ(r->status, 200);
  return parse_metrics(r->body);
}

// Waits until the engine has nothing running and returns the blocks in use.
double blocks_used_when_idle(HttpClient& client) {
  std::map<std::string, double> m;
  for (int i = 0; i < 500; ++i) {
    m = metrics(client);
    if (m["crescent_num_requests_running{model_name=\"tiny\"}"] == 0 &&
        m["crescent_num_requests_waiting{model_name=\"tiny\"}"] == 0 &&
        m["crescent_http_requests_in_flight{model_name=\"tiny\"}"] == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return m["crescent_kv_cache_blocks_used{model_name=\"tiny\"}"];
}

// Runs promtool check metrics on text: its exit code and output. scripts/setup.sh extracts
// Debian's promtool there; its absence is a broken setup, not a reason to skip.
std::pair<int, std::string> run_promtool(const std::string& text) {
  const std::string promtool = std::string(CRESCENT_SOURCE_DIR) + "/tools/prometheus/promtool";
  EXPECT_EQ(::access(promtool.c_str(), X_OK), 0) << promtool << " is missing: run scripts/setup.sh";
  std::string path =
      std::string(CRESCENT_BINARY_DIR) + "/serve_metrics_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path) << text;
  std::string cmd = promtool + " check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p && fgets(buf, sizeof(buf), p)) {
    out += buf;
  }
  int rc = p ? pclose(p) : -1;
  std::remove(path.c_str());
  return {rc, out};
}

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServeProcess(serve_args()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { client_ = std::make_unique<HttpClient>("127.0.0.1", server_->port()); }

  static ServeProcess* server_;
  std::unique_ptr<HttpClient> client_;
};
ServeProcess* ServeTest::server_ = nullptr;

TEST_F(ServeTest, SameGreedyTextEveryWayAndRightUsage) {
  json body = {{"model", "tiny"},
               {"prompt", "The capital of France is"},
               {"max_tokens", 12},
               {"temperature", 0},
               {"ignore_eos", true}};
  int status = 0;
  json whole = post_json(*client_, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  std::string text = whole["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 12);
  int num_prompt = whole["usage"]["prompt_tokens"];
  EXPECT_GT(num_prompt, 0);
  EXPECT_EQ(whole["usage"]["total_tokens"], num_prompt + 12);

  Streamed s = stream(*client_, "/v1/completions", body);
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.finish_reason, "length");
  EXPECT_EQ(s.usage["completion_tokens"], 12);
  EXPECT_EQ(s.usage["prompt_tokens"], num_prompt);

  // Chat: whole and streamed agree with each other.
  json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Name a colour."}}}},
               {"max_completion_tokens", 10},
               {"temperature", 0},
               {"ignore_eos", true}};
  json cwhole = post_json(*client_, "/v1/chat/completions", chat, &status);
  ASSERT_EQ(status, 200) << cwhole.dump();
  EXPECT_EQ(cwhole["usage"]["completion_tokens"], 10);
  Streamed cs = stream(*client_, "/v1/chat/completions", chat);
  EXPECT_EQ(cs.text, cwhole["choices"][0]["message"]["content"]);
  EXPECT_EQ(cs.usage, cwhole["usage"]);

  // Token-id prompts: prompt_tokens is exactly their number.
  json ids = {{"prompt", {11, 22, 33, 44, 55}},
              {"max_tokens", 3},
              {"temperature", 0},
              {"ignore_eos", true}};
  json by_ids = post_json(*client_, "/v1/completions", ids, &status);
  ASSERT_EQ(status, 200) << by_ids.dump();
  EXPECT_EQ(by_ids["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(by_ids["usage"]["completion_tokens"], 3);
}

TEST_F(ServeTest, SamplingFieldsStopAndKvTransferParams) {
  int status = 0;
  // Seeded sampling is reproducible.
  json sampled = {{"prompt", "Once upon a time"},
                  {"max_tokens", 8},
                  {"temperature", 0.8},
                  {"top_p", 0.9},
                  {"top_k", 50},
                  {"min_p", 0.05},
                  {"seed", 1234},
                  {"ignore_eos", true}};
  json a = post_json(*client_, "/v1/completions", sampled, &status);
  ASSERT_EQ(status, 200) << a.dump();
  json b = post_json(*client_, "/v1/completions", sampled, &status);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  // What the reference proxy sends to a prefill server is refused by a colocated one: it has
  // no KV connector, and silently ignoring the flags would leave the decode side waiting.
  json remote = {
      {"do_remote_decode", true}, {"do_remote_prefill", false}, {"transfer_id", "xfer-1"}};
  json refused =
      post_json(*client_, "/v1/completions",
                {{"prompt", "hello"}, {"max_tokens", 1}, {"kv_transfer_params", remote}}, &status);
  EXPECT_EQ(status, 400) << refused.dump();
  EXPECT_NE(refused.dump().find("--role prefill|decode"), std::string::npos) << refused.dump();
  // max_tokens 1 with logprobs and kv_transfer_params that ask for nothing remote: kept and
  // echoed.
  json kv = {{"do_remote_decode", false}, {"do_remote_prefill", false}, {"transfer_id", "xfer-1"}};
  json p = post_json(
      *client_, "/v1/completions",
      {{"prompt", "hello"}, {"max_tokens", 1}, {"logprobs", 3}, {"kv_transfer_params", kv}},
      &status);
  ASSERT_EQ(status, 200) << p.dump();
  EXPECT_EQ(p["kv_transfer_params"], kv);
  EXPECT_EQ(p["usage"]["completion_tokens"], 1);
  EXPECT_EQ(p["choices"][0]["logprobs"]["top_logprobs"][0].size(), 3u);
  EXPECT_LE(p["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 0.0);
  // A stop string ends the request with "stop" and is not part of the text.
  json greedy = {
      {"prompt", "Stop strings"}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  json full = post_json(*client_, "/v1/completions", greedy, &status);
  ASSERT_EQ(status, 200);
  std::string text = full["choices"][0]["text"];
  if (text.size() >= 4) {
    std::string stop = text.substr(text.size() / 2, 2);
    greedy["stop"] = {stop};
    json stopped = post_json(*client_, "/v1/completions", greedy, &status);
    ASSERT_EQ(status, 200) << stopped.dump();
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(stopped["choices"][0]["stop_reason"], stop);
    EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, text.find(stop)));
  }
  // X-Request-Id is honoured.
  auto r =
      client_->request("POST", "/v1/completions", R"({"prompt":"x","max_tokens":1})",
                       {{"Content-Type", "application/json"}, {"X-Request-Id", "req-42"}}, soon());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->header("x-request-id"), "req-42");
  EXPECT_EQ(json::parse(r->body)["id"], "cmpl-req-42");
}

TEST_F(ServeTest, MetricsParseAndPassPromtool) {
  int status = 0;
  post_json(*client_, "/v1/completions", {{"prompt", "metrics"}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200);
  auto r = client_->request("GET", "/metrics", "", {}, soon());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  auto m = parse_metrics(r->body);
  EXPECT_GE(m["crescent_generation_tokens_total{model_name=\"tiny\"}"], 4);
  EXPECT_GE(m["crescent_prompt_tokens_total{model_name=\"tiny\"}"], 1);
  EXPECT_GT(m["crescent_kv_cache_blocks{model_name=\"tiny\"}"], 0);
  EXPECT_GE(m["crescent_time_to_first_token_seconds_count"], 1);
  EXPECT_GE(m["crescent_e2e_request_latency_seconds_count"], 1);
  EXPECT_GE(m["crescent_time_per_output_token_seconds_count"], 1);
  // 4 tokens, one per engine step: 3 gaps between them.
  EXPECT_EQ(m["crescent_inter_token_latency_seconds_count"], 3);
  EXPECT_TRUE(m.count("crescent_prefix_cache_queries_total{model_name=\"tiny\"}"));
  EXPECT_TRUE(m.count("crescent_prefix_cache_hits_total{model_name=\"tiny\"}"));
  auto [rc, out] = run_promtool(r->body);
  EXPECT_EQ(rc, 0) << out;
}

// --vllm-metric-names: the same quantities under vLLM's names and labels, and promtool's only
// complaint is the ':' in them (its lint reserves ':' for recording rules; vLLM's own /metrics
// draws the same lines).
TEST(ServeVllmMetricNamesTest, SameQuantitiesUnderVllmNames) {
  std::vector<std::string> args = serve_args();
  args.push_back("--vllm-metric-names");
  ServeProcess server(args);
  HttpClient client("127.0.0.1", server.port());
  int status = 0;
  post_json(client, "/v1/completions",
            {{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 5}, {"ignore_eos", true}},
            &status);
  ASSERT_EQ(status, 200);
  auto r = client.request("GET", "/metrics", "", {}, soon());
  ASSERT_TRUE(r.is_ok());
  std::map<std::string, double> m = parse_metrics(r->body);
  const std::string vllm = "{model_name=\"tiny\",engine=\"0\"}";
  EXPECT_EQ(m["vllm:generation_tokens_total" + vllm], 5);
  EXPECT_EQ(m["vllm:generation_tokens_total" + vllm],
            m["crescent_generation_tokens_total{model_name=\"tiny\"}"]);
  EXPECT_EQ(m["vllm:prompt_tokens_total" + vllm],
            m["crescent_prompt_tokens_total{model_name=\"tiny\"}"]);
  EXPECT_EQ(m["vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason="
              "\"length\"}"],
            1);
  EXPECT_EQ(m["vllm:time_to_first_token_seconds_count" + vllm], 1);
  EXPECT_EQ(m["vllm:e2e_request_latency_seconds_count" + vllm], 1);
  EXPECT_EQ(m["vllm:inter_token_latency_seconds_count" + vllm], 4);
  EXPECT_TRUE(m.count("vllm:kv_cache_usage_perc" + vllm));
  EXPECT_TRUE(m.count("vllm:num_requests_running" + vllm));
  EXPECT_TRUE(m.count("vllm:num_requests_waiting" + vllm));
  auto [rc, out] = run_promtool(r->body);
  std::istringstream lines(out);
  std::string line;
  int num_complaints = 0;
  while (std::getline(lines, line)) {
    ++num_complaints;
    EXPECT_TRUE(line.starts_with("vllm:") &&
                line.find("metric names should not contain ':'") != std::string::npos)
        << line;
  }
  EXPECT_GT(num_complaints, 0) << "promtool no longer minds ':'? then say so in the docs";
}

TEST_F(ServeTest, BadInputTable) {
  std::string too_long = "{\"prompt\":[";
  for (int i = 0; i < kMaxModelLen + 10; ++i) {
    too_long += (i ? "," : "") + std::to_string(100 + i);
  }
  too_long += "]}";
  struct Case {
    std::string name;
    std::string method;
    std::string path;
    std::string body;
    int status;
  };
  const std::vector<Case> cases = {
      {"malformed JSON", "POST", "/v1/completions", "{\"prompt\": \"a\",", 400},
      {"wrong type", "POST", "/v1/completions", R"({"prompt":"a","max_tokens":"ten"})", 400},
      {"wrong type chat", "POST", "/v1/chat/completions", R"({"messages":{"role":"user"}})", 400},
      {"negative max_tokens", "POST", "/v1/completions", R"({"prompt":"a","max_tokens":-1})", 400},
      {"huge max_tokens", "POST", "/v1/completions", R"({"prompt":"a","max_tokens":1000000})", 400},
      {"prompt longer than the context", "POST", "/v1/completions", too_long, 400},
      {"invalid UTF-8", "POST", "/v1/completions", "{\"prompt\":\"ab\xff\xfe\"}", 400},
      {"empty messages", "POST", "/v1/chat/completions", R"({"messages":[]})", 400},
      {"unknown model", "POST", "/v1/completions", R"({"model":"gpt-9","prompt":"a"})", 404},
      {"body over the limit", "POST", "/v1/completions",
       R"({"prompt":")" + std::string(33u << 20, 'a') + R"("})", 413},
      {"unknown path", "GET", "/v1/engines", "", 404},
      {"wrong method", "GET", "/v1/chat/completions", "", 405},
      {"token id outside the vocabulary", "POST", "/v1/completions",
       R"({"prompt":[1,2,999999999]})", 400},
      {"bad temperature", "POST", "/v1/completions", R"({"prompt":"a","temperature":-1})", 400},
  };
  for (const auto& c : cases) {
    auto r =
        client_->request(c.method, c.path, c.body, {{"Content-Type", "application/json"}}, soon());
    ASSERT_TRUE(r.is_ok()) << c.name << ": " << r.status().to_string();
    EXPECT_EQ(r->status, c.status) << c.name << ": " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << c.name << ": " << r->body;
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty()) << c.name;
    EXPECT_TRUE(e["error"].contains("type") && e["error"].contains("code")) << c.name;
    // Still serving.
    int status = 0;
    post_json(*client_, "/v1/completions", {{"prompt", "ok"}, {"max_tokens", 1}}, &status);
    EXPECT_EQ(status, 200) << "after " << c.name;
  }
}

TEST_F(ServeTest, ConcurrentStreamsCompleteAndFreeEveryBlock) {
  constexpr int kNumRequests = 256;
  constexpr int kMaxTokens = 8;
  std::atomic<int> num_ok{0};
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kNumRequests);
  for (int i = 0; i < kNumRequests; ++i) {
    threads.emplace_back([&, i] {
      HttpClient client("127.0.0.1", server_->port());
      json body = {{"prompt", "request number " + std::to_string(i)},
                   {"max_tokens", kMaxTokens},
                   {"temperature", 0},
                   {"ignore_eos", true}};
      Streamed s = stream(client, "/v1/completions", body);
      if (s.status == 200 && s.done && s.usage["completion_tokens"] == kMaxTokens &&
          s.finish_reason == "length") {
        ++num_ok;
      } else {
        errors[i] = "status " + std::to_string(s.status) + " usage " + s.usage.dump();
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_ok.load(), kNumRequests);
  for (const auto& e : errors) {
    if (!e.empty()) {
      ADD_FAILURE() << e;
      break;
    }
  }
  EXPECT_EQ(blocks_used_when_idle(*client_), 0);
}

TEST_F(ServeTest, ClientThatLeavesIsAbortedAndItsBlocksFreed) {
  {
    HttpClient leaver("127.0.0.1", server_->port());
    int num_chunks = 0;
    auto r = leaver.stream(
        "POST", "/v1/completions",
        json({{"prompt", "a long story"},
              {"max_tokens", 200},
              {"ignore_eos", true},
              {"stream", true}})
            .dump(),
        {{"Content-Type", "application/json"}}, [&](std::string_view) { return ++num_chunks < 3; },
        soon());
    ASSERT_TRUE(r.is_ok());
  }
  EXPECT_EQ(blocks_used_when_idle(*client_), 0);
  auto m = metrics(*client_);
  EXPECT_GE((m["crescent_request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}"]),
            1);
}

TEST(ServeShutdownTest, SigtermDrainsInFlightRequestsAndExitsZero) {
  ServeProcess server(serve_args());
  std::atomic<bool> started{false};
  Streamed result;
  std::thread client_thread([&] {
    HttpClient client("127.0.0.1", server.port());
    json body = {
        {"prompt", "drain me"}, {"max_tokens", 64}, {"ignore_eos", true}, {"stream", true}};
    net::http::SseParser sse;
    auto r = client.stream(
        "POST", "/v1/completions", body.dump(), {{"Content-Type", "application/json"}},
        [&](std::string_view d) {
          started = true;
          sse.feed(d, [&](std::string_view e) {
            if (e == "[DONE]") {
              result.done = true;
            } else {
              json j = json::parse(e);
              if (!j["choices"].empty() && !j["choices"][0]["finish_reason"].is_null()) {
                result.finish_reason = j["choices"][0]["finish_reason"];
              }
            }
          });
          return true;
        },
        soon());
    result.status = r.is_ok() ? r->status : 0;
  });
  while (!started) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(server.terminate(), 0) << server.output();
  client_thread.join();
  EXPECT_EQ(result.status, 200);
  EXPECT_TRUE(result.done);
  EXPECT_EQ(result.finish_reason, "length");  // finished within the grace period, not aborted
  EXPECT_NE(server.output().find("draining 1 request"), std::string::npos) << server.output();
}

TEST(ServeConformanceTest, OfficialOpenAiNodeClient) {
  std::string node_modules = std::string(CRESCENT_SOURCE_DIR) + "/tools/npm/node_modules/openai";
  // scripts/setup.sh installs both; their absence is a broken setup, not a reason to skip.
  ASSERT_EQ(std::system("command -v node > /dev/null 2>&1"), 0)
      << "node is not installed: run scripts/setup.sh";
  ASSERT_EQ(std::system(("test -d " + node_modules).c_str()), 0)
      << node_modules << " is missing: run scripts/setup.sh";
  ServeProcess server(serve_args());
  std::string cmd =
      "node " + std::string(CRESCENT_SOURCE_DIR) +
      "/tests/server/openai_conformance.mjs http://127.0.0.1:" + std::to_string(server.port()) +
      "/v1 tiny 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) {
    out += buf;
  }
  int rc = pclose(p);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << out;
  EXPECT_NE(out.find("openai conformance: ok"), std::string::npos) << out;
}

}  // namespace
}  // namespace crescent::testing
