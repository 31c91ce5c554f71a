// `crescent serve` on the tiny model (Qwen3's chat template) with the request's template
// inputs: chat_template_kwargs, a request chat_template, continue_final_message, tool calls in
// the history, and the --chat-template flag (a file or the text; a bad one stops the start).
// The rendered prompt is observed through usage.prompt_tokens.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "net/http/http_client.h"
#include "server/serve_process.h"
#include "testing/test_models.h"

namespace crescent::testing {
namespace {

using json = nlohmann::json;
using net::http::HttpClient;

constexpr const char* kContentOnly = "{% for m in messages %}{{ m.content }}{% endfor %}";

// The tiny model unless `extra` names another --model.
std::vector<std::string> serve_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--threads",     "1", "--max-model-len", "256",
                                   "--kv-cache-mb", "16"};
  if (std::find(extra.begin(), extra.end(), "--model") == extra.end()) {
    args.push_back("--model");
    args.push_back(ensure_test_model("tiny"));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

class ChatServer {
 public:
  explicit ChatServer(std::vector<std::string> extra = {})
      : server_(serve_args(std::move(extra))), client_("127.0.0.1", server_.port()) {}

  json post(const std::string& path, const json& body, int* status) {
    auto r = client_.request("POST", path, body.dump(), {{"Content-Type", "application/json"}},
                             Deadline::after_ms(60'000));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    *status = r.is_ok() ? r->status : 0;
    return r.is_ok() ? json::parse(r->body, nullptr, false) : json();
  }
  // usage.prompt_tokens of a one-token chat completion; -1 (and a failure) when not a 200.
  int chat_prompt_tokens(json body) {
    body["max_tokens"] = 1;
    int status = 0;
    json r = post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << body.dump() << " -> " << r.dump();
    return status == 200 ? r["usage"]["prompt_tokens"].get<int>() : -1;
  }
  int completion_prompt_tokens(const std::string& prompt) {
    int status = 0;
    json r = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}}, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return status == 200 ? r["usage"]["prompt_tokens"].get<int>() : -1;
  }

 private:
  ServeProcess server_;
  HttpClient client_;
};

json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

TEST(ChatTemplateServeTest, RequestInputsChangeTheRenderedPrompt) {
  ChatServer server;
  const int base = server.chat_prompt_tokens({{"messages", user("hello there")}});
  ASSERT_GT(base, 0);
  // Qwen3's template closes an empty think block when enable_thinking is false.
  EXPECT_GT(server.chat_prompt_tokens({{"messages", user("hello there")},
                                       {"chat_template_kwargs", {{"enable_thinking", false}}}}),
            base);
  // A request's template replaces the model's: only the text is left.
  EXPECT_EQ(server.chat_prompt_tokens(
                {{"messages", user("hello there")}, {"chat_template", kContentOnly}}),
            server.completion_prompt_tokens("hello there"));

  // continue_final_message stops right after the assistant's text, without <|im_end|>.
  json partial = user("hello there");
  partial.push_back({{"role", "assistant"}, {"content", "General"}});
  const int closed =
      server.chat_prompt_tokens({{"messages", partial}, {"add_generation_prompt", false}});
  EXPECT_LT(server.chat_prompt_tokens({{"messages", partial},
                                       {"add_generation_prompt", false},
                                       {"continue_final_message", true}}),
            closed);

  // Tool calls and their results are rendered, not dropped.
  json history = user("hello there");
  history.push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        json::array(
            {{{"id", "c1"},
              {"type", "function"},
              {"function", {{"name", "weather"}, {"arguments", R"({"city":"Paris"})"}}}}})}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}});
  EXPECT_GT(server.chat_prompt_tokens({{"messages", history}}), base + 10);

  // With tool_choice "none", the tools are rendered (Qwen3's template lists them in a system
  // turn); without it they mean "auto", refused by a server without --enable-auto-tool-choice
  // (tests/server/openai_tools_node_test runs one with it).
  const json tools =
      json::array({{{"type", "function"},
                    {"function",
                     {{"name", "weather"},
                      {"description", "The weather in a city"},
                      {"parameters",
                       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  EXPECT_GT(server.chat_prompt_tokens(
                {{"messages", user("hello there")}, {"tools", tools}, {"tool_choice", "none"}}),
            base + 20);
  int status = 0;
  json e =
      server.post("/v1/chat/completions", {{"messages", user("x")}, {"tools", tools}}, &status);
  EXPECT_EQ(status, 400) << e.dump();
  EXPECT_EQ(e["error"]["param"], "tool_choice") << e.dump();

  // The template's refusals and syntax errors are 400s with its message.
  e = server.post("/v1/chat/completions", {{"messages", user("x")}, {"chat_template", "{% if %}"}},
                  &status);
  EXPECT_EQ(status, 400) << e.dump();
  EXPECT_NE(e["error"]["message"].get<std::string>().find("chat template"), std::string::npos)
      << e.dump();
  json developer = json::array({{{"role", "developer"}, {"content", "be brief"}}});
  e = server.post("/v1/chat/completions", {{"messages", developer}}, &status);
  EXPECT_EQ(status, 400) << e.dump();
  EXPECT_NE(e["error"]["message"].get<std::string>().find("'developer'"), std::string::npos)
      << e.dump();
  // A template that names the role renders it.
  EXPECT_EQ(server.chat_prompt_tokens(
                {{"messages", developer},
                 {"chat_template",
                  "{% for m in messages %}{% if m.role == 'developer' %}{{ m.content }}"
                  "{% endif %}{% endfor %}"}}),
            server.completion_prompt_tokens("be brief"));
}

TEST(ChatTemplateServeTest, ChatTemplateFlagReplacesTheModels) {
  const std::string file = std::filesystem::temp_directory_path().string() +
                           "/crescent_chat_template_" + std::to_string(getpid()) + ".jinja";
  {
    std::ofstream out(file);
    out << kContentOnly;
  }
  for (const std::string& flag : {file, std::string(kContentOnly)}) {
    ChatServer server({"--chat-template", flag});
    EXPECT_EQ(server.chat_prompt_tokens({{"messages", user("hello there")}}),
              server.completion_prompt_tokens("hello there"))
        << flag;
  }
  std::filesystem::remove(file);

  // A template that does not parse stops the start with a message naming the flag.
  std::string cmd = crescent_binary() + " serve --port 0 --model " + ensure_test_model("tiny") +
                    " --threads 1 --kv-cache-mb 16 --chat-template '{% for %}' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) {
    out += buf;
  }
  const int rc = pclose(p);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) != 0) << out;
  EXPECT_NE(out.find("--chat-template:"), std::string::npos) << out;
}

// `--model file.gguf` alone in a directory: tokenizer and chat template come from the file's
// metadata, and render the same prompt as the checkout's tokenizer.json + tokenizer_config.json.
TEST(ChatTemplateServeTest, LoneGgufServesChatWithTheTemplateFromTheFile) {
  namespace fs = std::filesystem;
  // A fresh model: a test-models/tiny made by an older binary has no template in its GGUF.
  const fs::path root =
      fs::temp_directory_path() / ("crescent_lone_gguf_" + std::to_string(getpid()));
  const std::string make = crescent_binary() + " make-model --preset tiny --out " +
                           (root / "full").string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  fs::create_directories(root / "lone");
  fs::copy_file(root / "full" / "model.gguf", root / "lone" / "model.gguf");
  const json messages =
      json::array({{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", "héllo 世界 <|im_start|> 42"}}});
  int checkout_tokens = 0;
  {
    ChatServer checkout({"--model", (root / "full").string()});
    checkout_tokens = checkout.chat_prompt_tokens({{"messages", messages}});
  }
  {
    ChatServer gguf({"--model", (root / "lone" / "model.gguf").string()});
    int status = 0;
    json r = gguf.post("/v1/chat/completions",
                       {{"messages", messages}, {"max_tokens", 4}, {"temperature", 0}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["usage"]["prompt_tokens"].get<int>(), checkout_tokens);
    EXPECT_GT(r["usage"]["completion_tokens"].get<int>(), 0);
    EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace crescent::testing
