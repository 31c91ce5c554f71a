#pragma once
// A stand-in OpenAI server for tests of the benchmark, on 127.0.0.1 and a free port: GET
// /v1/models lists one model; /v1/completions and /v1/chat/completions stream max_tokens
// one-token chunks, a usage chunk (prompt_tokens 5) and [DONE]. A policy picks requests to
// fail, by their number (1-based, counting every generation request): HTTP 500 with an
// OpenAI error body ("injected failure #N"), or an SSE error event after the first token.
// POST /tokenize and /detokenize speak vLLM's shapes, llama.cpp server's, or are absent (a
// 404), by set_tokenize_dialect(); their tokenizer is bytes: id = the byte's value, and 256 a
// BOS added when special tokens are asked for. They are not counted as requests.
// Thread-safe; stops when destroyed.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/http/http_server.h"

namespace crescent::bench {

class FakeOpenAiServer {
 public:
  enum class Failure { kNone, kHttp500, kErrorEventAfterFirstToken };
  enum class TokenizeDialect { kVllm, kLlamaCpp, kNone };
  using FailurePolicy = std::function<Failure(int request_number)>;

  struct SeenRequest {
    std::string path;
    std::string request_id;  // the X-Request-Id header
    std::string body;
  };

  static Result<std::unique_ptr<FakeOpenAiServer>> start(FailurePolicy policy,
                                                         std::string model_name = "fake-model");
  ~FakeOpenAiServer();

  int port() const;
  void set_tokenize_dialect(TokenizeDialect dialect);
  int num_tokenize_calls() const;
  int num_requests() const;
  std::vector<SeenRequest> seen_requests() const;

 private:
  FakeOpenAiServer(FailurePolicy policy, std::string model_name);
  void handle(net::http::Request request, std::shared_ptr<net::http::ResponseWriter> writer);
  void handle_tokenize(const net::http::Request& request, net::http::ResponseWriter& writer);

  FailurePolicy policy_;
  std::string model_name_;
  mutable std::mutex mu_;
  std::vector<SeenRequest> seen_;                              // guarded by mu_
  TokenizeDialect tokenize_dialect_ = TokenizeDialect::kVllm;  // guarded by mu_
  int num_tokenize_calls_ = 0;                                 // guarded by mu_
  std::unique_ptr<net::http::Server> server_;
};

}  // namespace crescent::bench
