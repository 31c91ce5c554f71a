// The OpenAI server's edges: --api-key (401s, open health and metrics paths), and bodies that
// must be a 400 on every JSON endpoint rather than an escaped exception (numbers beyond a
// double, deep nesting) or a silently dropped option (stream_options without stream).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/http/http_client.h"
#include "server/fake_engine_client.h"
#include "server/openai_server.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;

constexpr const char* kKey = "sk-test-0123456789";

Deadline soon() {
  return Deadline::after_ms(20'000);
}

class ServerEdgeTest : public ::testing::Test {
 protected:
  void start(std::string api_key) {
    OpenAiServerOptions options;
    options.served_model_name = "fake";
    options.api_key = std::move(api_key);
    auto server = OpenAiServer::start(options);
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    server_ = std::move(server).value();
    FakeEngineClient::Options fake;
    fake.max_model_len = 64;
    engine_ = std::make_unique<FakeEngineClient>(fake);
    server_->set_engine(engine_.get());
    client_ = std::make_unique<HttpClient>("127.0.0.1", server_->port());
  }
  void TearDown() override {
    client_.reset();
    if (server_) {
      server_->stop();
    }
  }
  net::http::Response call(const std::string& method, const std::string& path,
                           const std::string& body, net::http::Headers headers = {}) {
    headers["Content-Type"] = "application/json";
    auto r = client_->request(method, path, body, headers, soon());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : net::http::Response{};
  }
  // Checks the OpenAI/vLLM error shape and returns the message.
  static std::string error_message(const net::http::Response& r) {
    json e = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(e.is_object() && e["error"].is_object()) << r.body;
    if (!e.is_object() || !e["error"].is_object()) {
      return "";
    }
    EXPECT_EQ(e["error"]["code"], r.status) << r.body;
    EXPECT_TRUE(e["error"]["type"].is_string()) << r.body;
    return e["error"]["message"].get<std::string>();
  }

  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<FakeEngineClient> engine_;
  std::unique_ptr<HttpClient> client_;
};

const char* const kCompletion = R"({"model":"fake","prompt":"a","max_tokens":2})";
const char* const kChat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2})";

TEST_F(ServerEdgeTest, ApiKeyGuardsEveryOpenAiPath) {
  start(kKey);
  struct Probe {
    const char* method;
    const char* path;
    const char* body;
  };
  const Probe probes[] = {{"POST", "/v1/completions", kCompletion},
                          {"POST", "/v1/chat/completions", kChat},
                          {"GET", "/v1/models", ""},
                          {"GET", "/v1/nothing", ""}};
  struct Auth {
    std::optional<std::string> header;
    const char* says;
  };
  const Auth refused[] = {
      {std::nullopt, "needs an API key"},
      {std::string("Basic ") + kKey, "Bearer scheme"},
      {std::string(kKey), "Bearer scheme"},
      {"Bearer sk-test-wrong", "invalid API key"},
      {std::string("Bearer ") + kKey + "0", "invalid API key"},
  };
  for (const Probe& p : probes) {
    for (const Auth& a : refused) {
      net::http::Headers h;
      if (a.header) {
        h["Authorization"] = *a.header;
      }
      auto r = call(p.method, p.path, p.body, h);
      EXPECT_EQ(r.status, 401) << p.path << " " << a.header.value_or("(none)") << " -> " << r.body;
      EXPECT_EQ(r.header("www-authenticate"), "Bearer");
      const std::string message = error_message(r);
      EXPECT_NE(message.find(a.says), std::string::npos) << message;
      EXPECT_EQ(message.find(kKey), std::string::npos) << "the key leaked: " << message;
      EXPECT_EQ(json::parse(r.body)["error"]["type"], "authentication_error");
    }
  }
  const net::http::Headers good = {{"Authorization", std::string("Bearer ") + kKey}};
  auto completion = call("POST", "/v1/completions", kCompletion, good);
  EXPECT_EQ(completion.status, 200) << completion.body;
  auto chat = call("POST", "/v1/chat/completions", kChat, good);
  EXPECT_EQ(chat.status, 200) << chat.body;
  auto models = call("GET", "/v1/models", "", good);
  EXPECT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(call("GET", "/v1/nothing", "", good).status, 404);  // past the key: routing
  // Health checks and scrapes need no key, as in vLLM.
  for (const char* open : {"/health", "/metrics", "/version"}) {
    EXPECT_EQ(call("GET", open, "").status, 200) << open;
    EXPECT_EQ(call("GET", open, "", {{"Authorization", "Bearer wrong"}}).status, 200) << open;
  }
  // 401s are counted like any other answer.
  auto metrics = call("GET", "/metrics", "");
  EXPECT_NE(metrics.body.find("crescent_http_responses_total{status=\"401\"}"), std::string::npos)
      << metrics.body;
}

TEST_F(ServerEdgeTest, WithoutAKeyNoHeaderIsNeeded) {
  start("");
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion).status, 200);
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion, {{"Authorization", "Bearer x"}}).status,
            200);
}

TEST(ServerStartTest, AnUnsendableKeyStopsTheStart) {
  OpenAiServerOptions options;
  options.api_key = "two words";
  auto server = OpenAiServer::start(options);
  ASSERT_FALSE(server.is_ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server.status().message().find("two words"), std::string::npos);
}

TEST_F(ServerEdgeTest, UnparsableBodiesAre400OnEveryJsonEndpoint) {
  start(kKey);
  const net::http::Headers good = {{"Authorization", std::string("Bearer ") + kKey}};
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  struct Case {
    std::string body;  // with PROMPT standing for the endpoint's prompt field
    std::string says;
  };
  const Case cases[] = {
      {R"({PROMPT,"max_tokens":1e400})", "1e400 does not fit in a double"},
      {R"({PROMPT,"temperature":-1e400})", "-1e400 does not fit in a double"},
      {R"({PROMPT,"logit_bias":{"5":1e999}})", "1e999 does not fit in a double"},
      {R"({PROMPT,"user":)" + deep + "}", "more than 512 levels deep"},
      {R"({PROMPT,"kv_transfer_params":{"x":)" + deep + "}}", "more than 512 levels deep"},
      {R"({PROMPT,"stream_options":{"include_usage":true}})",
       "'stream_options' can only be given when 'stream' is true"},
  };
  for (auto [path, prompt] :
       {std::pair{"/v1/completions", R"("prompt":"a")"},
        std::pair{"/v1/chat/completions", R"("messages":[{"role":"user","content":"hi"}])"}}) {
    for (const Case& c : cases) {
      std::string body = c.body;
      body.replace(body.find("PROMPT"), 6, prompt);
      auto r = call("POST", path, body, good);
      EXPECT_EQ(r.status, 400) << path << " " << body.substr(0, 80) << " -> " << r.body;
      const std::string message = error_message(r);
      EXPECT_NE(message.find(c.says), std::string::npos) << path << ": " << message;
      // Still serving.
      EXPECT_EQ(call("POST", "/v1/completions", kCompletion, good).status, 200);
    }
  }
  auto streamed =
      call("POST", "/v1/completions",
           R"({"prompt":"a","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}})",
           good);
  EXPECT_EQ(streamed.status, 200);
  EXPECT_NE(streamed.body.find("\"usage\":{"), std::string::npos) << streamed.body;
}

}  // namespace
}  // namespace crescent::server
