#pragma once
// OpenAiServer: the OpenAI-compatible HTTP front of one engine. Routes /v1/completions,
// /v1/chat/completions (whole or streamed as SSE), /v1/models[/{id}], /tokenize,
// /detokenize, /v1/kv_events (token_endpoints.h), /health, /metrics and /version; turns each
// generation request into one EngineClient::submit whose outputs are written to the client from the
// engine's thread without blocking it; aborts a request whose client disconnects. Starts serving
// before the model is loaded (/health answers 503 until set_engine()). Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "core/task_queue.h"
#include "net/http/api_key.h"
#include "net/http/http_server.h"
#include "server/ec_pull.h"
#include "server/encode_handler.h"
#include "server/engine_client.h"
#include "server/metrics.h"
#include "server/multimodal_processor.h"
#include "server/tool_parsers/tool_parser.h"

namespace crescent::server {

struct OpenAiServerOptions {
  net::http::ServerOptions http;
  std::string served_model_name = "crescent";
  // max_tokens when a /v1/completions request gives none (OpenAI's default); chat requests
  // without one may use the rest of the context.
  int default_completion_max_tokens = 16;
  // Appends more Prometheus text to /metrics (the KV connector's metrics). Thread-safe.
  std::function<void(std::string*)> extra_metrics;
  // Threads that fetch, decode and preprocess request images (vision-language models).
  int num_media_threads = 2;
  // vLLM's --enable-auto-tool-choice and --tool-call-parser: chat requests with tools and
  // tool_choice "auto" (the default when tools are given) are answered with the calls parsed
  // from the output; without both they are a 400 (a prefill-only request excepted).
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;  // "" or a make_tool_parser() name
  // vLLM's --api-key: when set, every path but /health, /metrics and /version needs
  // `Authorization: Bearer <api_key>` (else 401); "" leaves the server open.
  std::string api_key;
  // Also render /metrics under vLLM's names (`--vllm-metric-names`, ServerMetrics::render).
  bool vllm_metric_names = false;
};

class OpenAiServer {
 public:
  // InvalidArgument for an unknown tool_call_parser or an API key that cannot be sent.
  static Result<std::unique_ptr<OpenAiServer>> start(OpenAiServerOptions options);
  ~OpenAiServer();  // stop()

  // Vision-language models: how image parts become engine inputs. Call before set_engine();
  // without it, requests with images are refused with a 400.
  void set_multimodal(std::shared_ptr<const MultimodalProcessor> multimodal);
  // EPD, prefill side: requests that carry ec_transfer_params get their images' embeddings
  // pulled from encoder workers. Call before set_engine(); without it the field is ignored
  // (a decode server, or a text-only model).
  void set_ec_puller(std::unique_ptr<EcImagePuller> puller);
  // EPD, `--role encode`: makes the server ready as an encoder, with no engine. Chat requests
  // with images are encoded into the EC producer's pool and answered with ec_transfer_params;
  // anything else is a 400. Call after set_multimodal(), instead of set_engine().
  void set_encoder(std::unique_ptr<EncodeHandler> encoder);
  // Makes the server ready; engine must outlive the server (or the next set_engine(nullptr)).
  void set_engine(EngineClient* engine);
  // Takes the server out of service for good (e.g. its bootstrap registration was fenced by a
  // newer engine): /health answers 503 with `reason`, generation requests a 503 that names it.
  void set_unavailable(std::string reason);
  int port() const;

  // Graceful shutdown, step 1: stop accepting connections; new generation requests on open
  // connections get 503.
  void begin_drain();
  // Generation requests accepted and not yet finished.
  int num_in_flight() const { return num_in_flight_.load(); }
  // Closes all connections and stops the I/O threads.
  void stop();

 private:
  struct Call;
  explicit OpenAiServer(OpenAiServerOptions options);
  void handle(net::http::Request request, std::shared_ptr<net::http::ResponseWriter> writer);
  void handle_generation(net::http::Request request,
                         std::shared_ptr<net::http::ResponseWriter> writer, bool chat);
  // The rest of handle_generation once the request's images (if any) are prepared: renders
  // and tokenizes the prompt, checks its length and submits it.
  void start_generation(const net::http::Request& request,
                        std::shared_ptr<net::http::ResponseWriter> writer,
                        std::shared_ptr<Call> call, bool chat, std::vector<PreparedImage> images);
  // --role encode: the whole answer to a generation request.
  // Ends the encoder reservations that a refused request's ec_transfer_params name (best
  // effort: nothing when the body or the params do not parse, or there is no EC consumer).
  void release_ec_params_of(const std::string& body);
  void handle_encode(const net::http::Request& request,
                     std::shared_ptr<net::http::ResponseWriter> writer, std::shared_ptr<Call> call,
                     bool chat);
  void on_output(const std::shared_ptr<Call>& call, const GenerationOutput& output);
  // A failed pull of encoder outputs: 504 on its deadline, else 502, with its message.
  void send_pull_failure(net::http::ResponseWriter& writer, const Status& pulled);
  std::string unavailable_reason();
  void send_json(net::http::ResponseWriter& writer, int status, const std::string& body,
                 net::http::Headers headers = {});

  OpenAiServerOptions options_;
  std::unique_ptr<net::http::Server> http_;
  std::atomic<EngineClient*> engine_{nullptr};
  std::unique_ptr<ToolParser> tool_parser_;  // from options_.tool_call_parser; immutable
  net::http::ApiKeyCheck api_key_;           // from options_.api_key; immutable
  // Written once before engine_ is set; read only after engine_ was seen non-null.
  std::shared_ptr<const MultimodalProcessor> multimodal_;
  // Written once before the server is ready (set_ec_puller / set_encoder).
  std::unique_ptr<EcImagePuller> ec_puller_;
  std::unique_ptr<EncodeHandler> encoder_;
  std::atomic<bool> is_encoder_ready_{false};
  std::atomic<bool> draining_{false};
  // Set once by set_unavailable(); is_unavailable_ is stored after the reason is written.
  std::mutex unavailable_mu_;
  std::string unavailable_reason_;
  std::atomic<bool> is_unavailable_{false};
  std::atomic<int> num_in_flight_{0};
  std::atomic<uint64_t> next_request_number_{0};
  // Images whose mm_hash and grid came from ec_transfer_params (a decode server, EPD).
  std::atomic<int64_t> num_images_from_ec_params_total_{0};
  ServerMetrics metrics_;
  // Image fetching and decoding (set_multimodal); declared last so that it is joined first.
  std::unique_ptr<TaskQueue> media_workers_;
};

}  // namespace crescent::server
