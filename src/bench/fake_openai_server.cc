#include "bench/fake_openai_server.h"

#include <nlohmann/json.hpp>

namespace crescent::bench {

using json = nlohmann::json;

Result<std::unique_ptr<FakeOpenAiServer>> FakeOpenAiServer::start(FailurePolicy policy,
                                                                  std::string model_name) {
  std::unique_ptr<FakeOpenAiServer> fake(
      new FakeOpenAiServer(std::move(policy), std::move(model_name)));
  net::http::ServerOptions options;
  options.num_io_threads = 2;
  FakeOpenAiServer* self = fake.get();
  ASSIGN_OR_RETURN(
      fake->server_,
      net::http::Server::start(options, [self](net::http::Request request,
                                               std::shared_ptr<net::http::ResponseWriter> w) {
        self->handle(std::move(request), std::move(w));
      }));
  return fake;
}

FakeOpenAiServer::FakeOpenAiServer(FailurePolicy policy, std::string model_name)
    : policy_(std::move(policy)), model_name_(std::move(model_name)) {}

FakeOpenAiServer::~FakeOpenAiServer() {
  if (server_) {
    server_->stop();
  }
}

int FakeOpenAiServer::port() const {
  return server_->port();
}

int FakeOpenAiServer::num_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(seen_.size());
}

std::vector<FakeOpenAiServer::SeenRequest> FakeOpenAiServer::seen_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

void FakeOpenAiServer::set_tokenize_dialect(TokenizeDialect dialect) {
  std::lock_guard<std::mutex> lock(mu_);
  tokenize_dialect_ = dialect;
}

int FakeOpenAiServer::num_tokenize_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_tokenize_calls_;
}

void FakeOpenAiServer::handle_tokenize(const net::http::Request& request,
                                       net::http::ResponseWriter& w) {
  TokenizeDialect dialect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dialect = tokenize_dialect_;
    ++num_tokenize_calls_;
  }
  const bool vllm = dialect == TokenizeDialect::kVllm;
  json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  const char* text_key = vllm ? "prompt" : "content";
  const char* special_key = vllm ? "add_special_tokens" : "add_special";
  const bool tokenize = request.path == "/tokenize";
  const bool understood = dialect != TokenizeDialect::kNone && body.is_object() &&
                          (tokenize ? body.contains(text_key) && body[text_key].is_string()
                                    : body.contains("tokens") && body["tokens"].is_array());
  if (!understood) {
    return w.send(dialect == TokenizeDialect::kNone ? 404 : 400, "application/json",
                  R"({"error":{"message":"not understood"}})");
  }
  if (tokenize) {
    std::vector<int> ids;
    if (body.value(special_key, true)) {
      ids.push_back(256);
    }
    for (unsigned char c : body[text_key].get<std::string>()) {
      ids.push_back(c);
    }
    return w.send(200, "application/json", json{{"tokens", ids}, {"count", ids.size()}}.dump());
  }
  std::string text;
  for (const json& id : body["tokens"]) {
    if (id.is_number_integer() && id.get<int>() >= 0 && id.get<int>() < 256) {
      text += static_cast<char>(id.get<int>());
    }
  }
  return w.send(200, "application/json",
                json{{text_key, text}}.dump(-1, ' ', false, json::error_handler_t::replace));
}

void FakeOpenAiServer::handle(net::http::Request request,
                              std::shared_ptr<net::http::ResponseWriter> w) {
  if (request.path == "/tokenize" || request.path == "/detokenize") {
    return handle_tokenize(request, *w);
  }
  if (request.path == "/v1/models") {
    json models = {{"object", "list"},
                   {"data", json::array({{{"id", model_name_}, {"object", "model"}}})}};
    return w->send(200, "application/json", models.dump());
  }
  bool chat = request.path == "/v1/chat/completions";
  if (!chat && request.path != "/v1/completions") {
    return w->send(404, "application/json", R"({"error":{"message":"no route"}})");
  }
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({request.path, request.header("x-request-id"), request.body});
    n = static_cast<int>(seen_.size());
  }
  json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  const char* max_field = chat ? "max_completion_tokens" : "max_tokens";
  if (!body.is_object() || !body.contains(max_field) || !body[max_field].is_number_integer()) {
    return w->send(400, "application/json",
                   R"({"error":{"message":"bad body","type":"invalid_request_error"}})");
  }
  int max_tokens = body[max_field].get<int>();
  Failure failure = policy_ ? policy_(n) : Failure::kNone;
  if (failure == Failure::kHttp500) {
    json error = {{"error",
                   {{"message", "injected failure #" + std::to_string(n)},
                    {"type", "internal_server_error"},
                    {"param", nullptr},
                    {"code", nullptr}}}};
    return w->send(500, "application/json", error.dump());
  }
  w->start_stream(200, "text/event-stream");
  if (chat) {
    w->write(
        "data: "
        R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"
        "\n\n");
  }
  for (int i = 0; i < max_tokens; ++i) {
    if (failure == Failure::kErrorEventAfterFirstToken && i == 1) {
      w->write(R"(data: {"error":{"message":"generation failed: injected","type":"x"}})"
               "\n\n");
      w->write("data: [DONE]\n\n");
      return w->end();
    }
    json choice = chat ? json{{"index", 0}, {"delta", {{"content", "t"}}}}
                       : json{{"index", 0}, {"text", "t"}};
    w->write("data: " + json{{"choices", json::array({choice})}}.dump() + "\n\n");
  }
  json usage = {
      {"prompt_tokens", 5}, {"completion_tokens", max_tokens}, {"total_tokens", max_tokens + 5}};
  w->write("data: " + json{{"choices", json::array()}, {"usage", usage}}.dump() + "\n\n");
  w->write("data: [DONE]\n\n");
  w->end();
}

}  // namespace crescent::bench
