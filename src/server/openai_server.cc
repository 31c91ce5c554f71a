#include "server/openai_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "core/clock.h"
#include "core/ids.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/prometheus.h"
#include "server/forced_tool_choice.h"
#include "server/openai_protocol.h"
#include "server/token_endpoints.h"

namespace crescent::server {

using json = nlohmann::json;
using net::http::Headers;
using net::http::Request;
using net::http::ResponseWriter;

namespace {

int64_t unix_seconds() {
  return static_cast<int64_t>(std::time(nullptr));
}

// What a failed generation answers. A decode-side request whose remote KV fetch failed names
// a fault upstream of this server: 504 when a deadline passed, 502 when the prefill side, the
// bootstrap or the link failed. A request that conflicts with another (a reused request id or
// transfer_id) is the client's 400. The rest is this server's own 500.
ApiError generation_error(const GenerationOutput& out, const engine::KvTransferParams& kv) {
  std::string message = "generation failed: " + out.error_message;
  switch (out.error_code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kAlreadyExists:
      return api_error(400, std::move(message), "invalid_request_error");
    case StatusCode::kInternal:
    case StatusCode::kOk:
      break;
    case StatusCode::kDeadlineExceeded:
      if (kv.do_remote_prefill) {
        return api_error(504, std::move(message), "timeout_error");
      }
      break;
    default:
      if (kv.do_remote_prefill) {
        return api_error(502, std::move(message), "upstream_error");
      }
      break;
  }
  return api_error(500, std::move(message), "internal_server_error");
}

json usage_json(int prompt, int completion, int cached) {
  json u = {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  if (cached > 0) {
    u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  }
  return u;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) {
    b.push_back(static_cast<int>(c));
  }
  return b;
}

// Logprobs of a run of tokens in the shape of one endpoint: chat's "content" list, or the
// completions' parallel arrays with text offsets counted from `*offset`.
json shape_logprobs(const EngineClient& engine, const std::vector<TokenLogprobs>& logprobs,
                    bool chat, size_t* offset) {
  json content = json::array(), tokens = json::array(), token_logprobs = json::array(),
       top_logprobs = json::array(), text_offsets = json::array();
  for (const auto& lp : logprobs) {
    std::string token = engine.token_text(lp.sampled.token_id);
    if (chat) {
      json top = json::array();
      for (const auto& t : lp.top) {
        std::string s = engine.token_text(t.token_id);
        top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
      }
      content.push_back({{"token", token},
                         {"logprob", lp.sampled.logprob},
                         {"bytes", bytes_of(token)},
                         {"top_logprobs", top}});
    } else {
      json top = json::object();
      for (const auto& t : lp.top) {
        top[engine.token_text(t.token_id)] = t.logprob;
      }
      tokens.push_back(token);
      token_logprobs.push_back(lp.sampled.logprob);
      top_logprobs.push_back(top);
      text_offsets.push_back(*offset);
      *offset += token.size();
    }
  }
  if (chat) {
    return json{{"content", std::move(content)}};
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(text_offsets)}};
}

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

// OpenAI's streamed shape of complete calls: for each, a delta with its index, id, type and
// name, then one with all its arguments (crescent sends a call once its markup has ended).
void append_tool_call_deltas(const std::vector<ToolCall>& calls, int* num_sent,
                             std::vector<json>* deltas) {
  for (const ToolCall& call : calls) {
    const int index = (*num_sent)++;
    deltas->push_back({{"tool_calls", json::array({{{"index", index},
                                                    {"id", call.id},
                                                    {"type", "function"},
                                                    {"function", {{"name", call.name}}}}})}});
    deltas->push_back(
        {{"tool_calls",
          json::array({{{"index", index}, {"function", {{"arguments", call.arguments}}}}})}});
  }
}

// vLLM's finish reason once calls were parsed: "tool_calls" for an output that ended on its
// own or at max_tokens.
json finish_reason_with_calls(const json& finish_reason) {
  return finish_reason == "stop" || finish_reason == "length" ? json("tool_calls") : finish_reason;
}

}  // namespace

// One choice of a generation request from arrival to its last byte.
struct OpenAiServer::Call {
  // The n choices of one request share one Group: the lock that orders the stream's start
  // before any output and serializes the choices' writes, and what the response needs once
  // every choice has finished.
  struct Group {
    std::mutex mu;
    int num_choices = 1;
    int num_finished = 0;
    int num_output_tokens = 0;   // summed over the finished choices
    bool failed = false;         // non-streamed: a choice failed and its error was sent
    bool submit_failed = false;  // the request was refused: every output is dropped
    std::vector<json> choices;   // non-streamed: each finished choice, by index
    // Non-streamed best_of > n: each choice's cumulative logprob and output token count.
    std::vector<double> cumulative_logprobs;
    std::vector<int> num_tokens;
  };
  std::shared_ptr<Group> group = std::make_shared<Group>();
  int index = 0;  // of this choice
  GenerationRequest request;
  std::string engine_id;
  std::string response_id;
  std::string x_request_id;
  int64_t created = 0;
  int64_t arrival_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;  // of the latest output that carried tokens
  std::shared_ptr<ResponseWriter> writer;
  EngineClient* engine = nullptr;
  // Non-streamed: accumulated output. Streamed: text_offset for completions logprobs.
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  size_t text_offset = 0;
  bool sent_first_chunk = false;
  // Chat with tool_choice "auto" on a server with a tool parser: the calls are parsed from the
  // output (whole: at the end; streamed: by tool_streamer).
  bool parses_tool_calls = false;
  std::unique_ptr<ToolCallStreamer> tool_streamer;
  int num_tool_calls_sent = 0;
  // Chat with tool_choice "required" or a named function: the output is the calls' JSON
  // (forced_tool_choice.h). Streamed, a named call's arguments go out as they come, "required"
  // calls once the array is complete.
  bool forces_tool_calls = false;

  void append_forced_call_deltas(const GenerationOutput& out, std::vector<json>* deltas);
  // `first` and the request's other best_of - 1 choices, sharing first's group and ids;
  // `tool_parser` starts their streamers.
  static std::vector<std::shared_ptr<Call>> make_choices(const std::shared_ptr<Call>& first,
                                                         const ToolParser* tool_parser);
  static int keep_best_choices(int n, Group* group);
};

// The deltas of one streamed output of a forced tool choice. Named: the call's head (index,
// id, type, name) with the first output, then each piece of text as arguments, as vLLM
// streams it. "required": the calls once the array is complete, or the text as content when
// the output did not complete it.
void OpenAiServer::Call::append_forced_call_deltas(const GenerationOutput& out,
                                                   std::vector<json>* deltas) {
  Call& call = *this;
  const GenerationRequest& req = call.request;
  if (req.tool_choice == ToolChoice::kNamed) {
    if (call.num_tool_calls_sent == 0) {
      call.num_tool_calls_sent = 1;
      deltas->push_back(
          {{"tool_calls",
            json::array({{{"index", 0},
                          {"id", tool_parser_internal::new_tool_call_id()},
                          {"type", "function"},
                          {"function", {{"name", req.tool_choice_name}, {"arguments", ""}}}}})}});
    }
    if (!out.new_text.empty()) {
      deltas->push_back(
          {{"tool_calls",
            json::array({{{"index", 0}, {"function", {{"arguments", out.new_text}}}}})}});
    }
    return;
  }
  call.text += out.new_text;
  if (!out.finished) {
    return;
  }
  if (auto calls = forced_tool_calls(req, call.text)) {
    append_tool_call_deltas(*calls, &call.num_tool_calls_sent, deltas);
  } else if (!call.text.empty()) {
    deltas->push_back({{"content", call.text}});
  }
}

OpenAiServer::OpenAiServer(OpenAiServerOptions options) : options_(std::move(options)) {}

OpenAiServer::~OpenAiServer() {
  stop();
}

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::start(OpenAiServerOptions options) {
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(options));
  if (!options.tool_call_parser.empty()) {
    ASSIGN_OR_RETURN(server->tool_parser_, make_tool_parser(options.tool_call_parser));
  }
  if (!options.api_key.empty()) {
    ASSIGN_OR_RETURN(server->api_key_, net::http::ApiKeyCheck::make(options.api_key));
  }
  OpenAiServer* self = server.get();
  ASSIGN_OR_RETURN(
      server->http_,
      net::http::Server::start(options.http, [self](Request r, std::shared_ptr<ResponseWriter> w) {
        self->handle(std::move(r), std::move(w));
      }));
  return server;
}

void OpenAiServer::set_multimodal(std::shared_ptr<const MultimodalProcessor> multimodal) {
  multimodal_ = std::move(multimodal);
  if (multimodal_ != nullptr && media_workers_ == nullptr) {
    media_workers_ = std::make_unique<TaskQueue>(options_.num_media_threads);
  }
}

void OpenAiServer::set_ec_puller(std::unique_ptr<EcImagePuller> puller) {
  ec_puller_ = std::move(puller);
}

void OpenAiServer::set_encoder(std::unique_ptr<EncodeHandler> encoder) {
  encoder_ = std::move(encoder);
  is_encoder_ready_.store(encoder_ != nullptr && multimodal_ != nullptr);
}

void OpenAiServer::set_engine(EngineClient* engine) {
  engine_.store(engine);
}

void OpenAiServer::set_unavailable(std::string reason) {
  {
    std::lock_guard<std::mutex> lock(unavailable_mu_);
    if (is_unavailable_.load()) {
      return;
    }
    unavailable_reason_ = std::move(reason);
  }
  is_unavailable_.store(true);
  engine_.store(nullptr);
  is_encoder_ready_.store(false);
}

std::string OpenAiServer::unavailable_reason() {
  std::lock_guard<std::mutex> lock(unavailable_mu_);
  return unavailable_reason_;
}
int OpenAiServer::port() const {
  return http_->port();
}

void OpenAiServer::begin_drain() {
  draining_.store(true);
  http_->stop_accepting();
}

void OpenAiServer::stop() {
  if (http_) {
    http_->stop();
  }
}

void OpenAiServer::send_json(ResponseWriter& writer, int status, const std::string& body,
                             Headers headers) {
  metrics_.observe_http_request(status);
  writer.send(status, "application/json", body, std::move(headers));
}

void OpenAiServer::handle(Request request, std::shared_ptr<ResponseWriter> writer) {
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {
      {"/health", "GET"},    {"/v1/models", "GET"},       {"/metrics", "GET"},
      {"/version", "GET"},   {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"}, {"/detokenize", "POST"},     {"/v1/kv_events", "GET"},
  };
  // Before routing, as vLLM's middleware: without the key a client learns nothing of the paths.
  if (auto refusal = api_key_.refusal(request)) {
    return send_json(*writer, 401,
                     dump_json(error_json(api_error(401, *refusal, "authentication_error"))),
                     net::http::unauthorized_headers());
  }
  // GET /v1/models/{id}: one model, as vLLM answers it.
  static const Route kModelRoute = {"/v1/models/{id}", "GET"};
  const Route* route = request.path.starts_with("/v1/models/") ? &kModelRoute : nullptr;
  for (const auto& r : kRoutes) {
    if (request.path == r.path) {
      route = &r;
    }
  }
  if (route == nullptr) {
    return send_json(
        *writer, 404,
        dump_json(error_json(api_error(404, "no route for " + request.path, "not_found_error"))));
  }
  if (request.method != route->method) {
    return send_json(
        *writer, 405,
        dump_json(error_json(api_error(
            405, request.method + " is not allowed on " + request.path + "; use " + route->method,
            "invalid_request_error"))),
        {{"Allow", route->method}});
  }
  EngineClient* engine = engine_.load();
  const bool is_ready = engine != nullptr || is_encoder_ready_.load();
  if (request.path == "/health") {
    if (is_unavailable_.load()) {
      metrics_.observe_http_request(503);
      return writer->send(503, "text/plain", "unavailable: " + unavailable_reason() + "\n");
    }
    if (!is_ready || draining_.load()) {
      metrics_.observe_http_request(503);
      return writer->send(503, "text/plain", !is_ready ? "loading\n" : "draining\n");
    }
    metrics_.observe_http_request(200);
    return writer->send(200, "", "");
  }
  if (request.path == "/metrics") {
    metrics_.observe_http_request(200);
    std::string text =
        metrics_.render(options_.served_model_name, engine ? engine->metrics() : EngineMetrics{},
                        num_in_flight_.load(), options_.vllm_metric_names);
    if (is_encoder_ready_.load()) {
      encoder_->render_metrics(options_.served_model_name, &text);
    }
    if (ec_puller_ != nullptr && engine != nullptr) {
      ec_puller_->render_metrics(options_.served_model_name, &text);
    }
    if (multimodal_ != nullptr && !multimodal_->options().needs_pixel_values) {
      const std::string name = "crescent_ec_images_described_total";
      prometheus::append_header(&text, name, "counter",
                                "Images whose mm_hash and grid a decode server took from "
                                "ec_transfer_params instead of decoding them.");
      text +=
          name + "{model_name=\"" + options_.served_model_name + "\"} " +
          prometheus::format_number(static_cast<double>(num_images_from_ec_params_total_.load())) +
          "\n";
    }
    if (options_.extra_metrics) {
      options_.extra_metrics(&text);
    }
    return writer->send(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
  }
  if (request.path == "/version") {
    return send_json(*writer, 200, R"({"version":"crescent-0.1"})");
  }
  if (request.path == "/v1/models" || route == &kModelRoute) {
    json model = {{"id", options_.served_model_name},   {"object", "model"},
                  {"created", unix_seconds()},          {"owned_by", "crescent"},
                  {"root", options_.served_model_name}, {"parent", nullptr}};
    if (engine != nullptr) {
      model["max_model_len"] = engine->max_model_len();
    }
    if (route != &kModelRoute) {
      return send_json(*writer, 200,
                       dump_json(json{{"object", "list"}, {"data", json::array({model})}}));
    }
    const std::string id = request.path.substr(std::string_view("/v1/models/").size());
    if (id != options_.served_model_name) {
      return send_json(*writer, 404,
                       dump_json(error_json(api_error(404, "The model `" + id + "` does not exist.",
                                                      "not_found_error"))));
    }
    return send_json(*writer, 200, dump_json(model));
  }
  if (request.path == "/tokenize" || request.path == "/detokenize" ||
      request.path == "/v1/kv_events") {
    if (engine == nullptr) {
      return send_json(
          *writer, 503,
          dump_json(error_json(api_error(
              503,
              is_ready ? "this server has no model to tokenize with" : "the model is still loading",
              "service_unavailable"))));
    }
    const size_t q = request.target.find('?');
    EndpointReply reply =
        request.path == "/tokenize" ? tokenize_reply(*engine, request.body)
        : request.path == "/detokenize"
            ? detokenize_reply(*engine, request.body)
            : kv_events_reply(*engine, q == std::string::npos
                                           ? std::string_view()
                                           : std::string_view(request.target).substr(q + 1));
    return send_json(*writer, reply.status, reply.body);
  }
  // Read before the move: argument evaluation order is unspecified.
  const bool chat = request.path == "/v1/chat/completions";
  handle_generation(std::move(request), std::move(writer), chat);
}

namespace {

bool all_images_are_ec_refs(const std::vector<ImageRef>& images) {
  for (const ImageRef& image : images) {
    if (!image.url.starts_with("ec://")) {
      return false;
    }
  }
  return !images.empty();
}

}  // namespace

void OpenAiServer::handle_generation(Request request, std::shared_ptr<ResponseWriter> writer,
                                     bool chat) {
  // Until ec_transfer_params is parsed below, a refusal also ends the encoder reservations the
  // body names (best effort), so that refused requests do not hold the encoder's pool until
  // their reservations expire.
  // Likewise a prefill engine holding KV for a request this (decode) server refuses frees it at
  // once instead of at its transfer deadline.
  bool ec_params_taken = false;
  EngineClient* engine = engine_.load();
  auto fail = [&](const ApiError& e) {
    if (!ec_params_taken) {
      release_ec_params_of(request.body);
    }
    if (engine != nullptr) {
      if (auto kv = remote_prefill_of(request.body)) {
        engine->release_refused_transfer(*kv);
      }
    }
    send_json(*writer, e.http_status, dump_json(error_json(e)));
  };
  const bool is_encoder = is_encoder_ready_.load();
  if (is_unavailable_.load()) {
    return fail(api_error(503, "this server is out of service: " + unavailable_reason(),
                          "service_unavailable"));
  }
  if (engine == nullptr && !is_encoder) {
    return fail(api_error(503, "the model is still loading", "service_unavailable"));
  }
  if (draining_.load()) {
    return fail(api_error(503, "the server is shutting down", "service_unavailable"));
  }
  auto call = std::make_shared<Call>();
  call->arrival_ns = now_ns();
  call->created = unix_seconds();
  call->engine = engine;
  call->writer = writer;
  GenerationRequest& req = call->request;
  if (auto e = parse_generation_request(request.body,
                                        chat ? Endpoint::kChat : Endpoint::kCompletions, &req)) {
    return fail(*e);
  }
  if (!req.model.empty() && req.model != options_.served_model_name) {
    ApiError e = api_error(404, "The model `" + req.model + "` does not exist.", "not_found_error");
    e.param = "model";
    return fail(e);
  }
  if (std::max(req.n, req.best_of) > 1 && req.kv_transfer_params) {
    const char* field = req.n > 1 ? "n" : "best_of";
    return fail(bad_request(std::string("'") + field +
                                "' greater than 1 is not supported in disaggregated serving "
                                "(this request carries kv_transfer_params): send separate "
                                "requests",
                            field));
  }
  if (is_encoder) {
    return handle_encode(request, std::move(writer), std::move(call), chat);
  }
  if (req.tool_choice == ToolChoice::kAuto) {
    // A prefill server's output is thrown away (the decode server parses the calls), so it
    // needs no parser: P/D pairs need the flags on the decode side only.
    const bool has_flag = options_.enable_auto_tool_choice;
    const bool has_parser = tool_parser_ != nullptr;
    if (!req.kv_transfer.do_remote_decode && !(has_flag && has_parser)) {
      const std::string missing = !has_flag && !has_parser ? "--enable-auto-tool-choice and "
                                                             "--tool-call-parser"
                                  : !has_flag              ? "--enable-auto-tool-choice"
                                                           : "--tool-call-parser";
      return fail(bad_request(
          R"('tool_choice' "auto" (the default when 'tools' are given) needs the server started )"
          "with --enable-auto-tool-choice and --tool-call-parser (" +
              tool_parser_names() + "); this server lacks " + missing +
              R"(. Send "tool_choice": "none" to only show the tools to the model.)",
          "tool_choice"));
    }
    call->parses_tool_calls = has_flag && has_parser && !req.kv_transfer.do_remote_decode;
    if (call->parses_tool_calls && tool_parser_->needs_special_tokens()) {
      req.sampling.skip_special_tokens = false;  // as vLLM's hermes parser does
    }
    if (call->parses_tool_calls && req.stream) {
      call->tool_streamer = tool_parser_->start_stream();
    }
  }
  call->forces_tool_calls =
      req.tool_choice == ToolChoice::kNamed || req.tool_choice == ToolChoice::kRequired;

  // EPD: the encoder outputs this request's images may take instead of encoding here.
  std::vector<EcItem> ec_items;
  ec_params_taken = true;
  if (req.ec_transfer_params && ec_puller_ != nullptr) {
    auto parsed = ec_puller_->parse(*req.ec_transfer_params);
    if (!parsed.is_ok()) {
      const std::string& m = parsed.status().message();
      return fail(bad_request(m.starts_with("ec_transfer_params") ? m : "ec_transfer_params: " + m,
                              "ec_transfer_params"));
    }
    ec_items = std::move(parsed).value();
  }
  if (req.images.empty()) {
    if (!ec_items.empty()) {
      ec_puller_->release(ec_items);
    }
    return start_generation(request, std::move(writer), std::move(call), chat, {});
  }
  if (multimodal_ == nullptr) {
    if (!ec_items.empty()) {
      ec_puller_->release(ec_items);
    }
    return fail(bad_request("the model `" + options_.served_model_name + "` does not take images",
                            "messages"));
  }
  // Fetching (file://, http://), decoding and preprocessing may take a while: off the I/O
  // thread. A bad image is refused before anything is rendered or queued. Pulled embeddings
  // are in place before the request reaches the engine.
  // A decode server takes the images' mm_hash and grid from the items the proxy sent, when they
  // fit, instead of decoding images it never encodes.
  std::optional<std::vector<PreparedImage>> from_params;
  if (ec_puller_ == nullptr && req.ec_transfer_params) {
    from_params = multimodal_->prepared_from_ec_params(*req.ec_transfer_params, req.images.size());
  }
  if (from_params) {
    num_images_from_ec_params_total_.fetch_add(static_cast<int64_t>(from_params->size()));
    return start_generation(request, std::move(writer), std::move(call), chat,
                            std::move(*from_params));
  }
  // A prefill server whose images come as ec:// references only (the proxy's
  // --prefill-images ref): the items describe them, and a failed pull cannot fall back.
  std::optional<std::vector<PreparedImage>> described;
  if (!ec_items.empty() && all_images_are_ec_refs(req.images)) {
    described = multimodal_->described_by_ec_params(*req.ec_transfer_params, req.images.size());
  }
  if (described) {
    num_images_from_ec_params_total_.fetch_add(static_cast<int64_t>(described->size()));
    media_workers_->post([this, shared_request = std::make_shared<Request>(std::move(request)),
                          writer, call, chat, ec_items = std::move(ec_items),
                          images = std::move(*described)]() mutable {
      Status pulled = ec_puller_->pull(images, ec_items);
      if (pulled.is_ok()) {
        for (const PreparedImage& image : images) {
          if (image.embeddings == nullptr) {
            pulled = unavailable(
                "image " + image.mm_hash.substr(0, 16) +
                ": its encoder output could not be pulled and the request names it only by an "
                "ec:// reference, so it cannot be encoded here");
            break;
          }
        }
      }
      if (!pulled.is_ok()) {
        return send_pull_failure(*writer, pulled);
      }
      start_generation(*shared_request, writer, call, chat, std::move(images));
    });
    return;
  }
  auto shared_request = std::make_shared<Request>(std::move(request));
  media_workers_->post([this, shared_request, writer, call, chat, ec_items = std::move(ec_items)] {
    // With items to pull, the resize and patch flattening wait until a pull has failed.
    auto prepared = multimodal_->prepare(
        call->request.images, ec_items.empty() ? MultimodalProcessor::PixelValues::kNow
                                               : MultimodalProcessor::PixelValues::kDeferred);
    if (!prepared.is_ok()) {
      if (!ec_items.empty()) {
        ec_puller_->release(ec_items);
      }
      send_json(*writer, 400,
                dump_json(error_json(bad_request(prepared.status().message(), "messages"))));
      return;
    }
    if (!ec_items.empty()) {
      Status pulled = ec_puller_->pull(*prepared, ec_items);
      if (!pulled.is_ok()) {
        return send_pull_failure(*writer, pulled);
      }
      Status made = multimodal_->make_pixel_values(*prepared);
      if (!made.is_ok()) {
        send_json(*writer, 400, dump_json(error_json(bad_request(made.message(), "messages"))));
        return;
      }
    }
    start_generation(*shared_request, writer, call, chat, std::move(prepared).value());
  });
}

void OpenAiServer::send_pull_failure(ResponseWriter& writer, const Status& pulled) {
  const bool timed_out = pulled.code() == StatusCode::kDeadlineExceeded;
  const int status = timed_out ? 504 : 502;
  send_json(writer, status,
            dump_json(error_json(api_error(status, pulled.message(),
                                           timed_out ? "timeout_error" : "upstream_error"))));
}

void OpenAiServer::release_ec_params_of(const std::string& body) {
  if (ec_puller_ == nullptr || body.find("ec_transfer_params") == std::string::npos) {
    return;
  }
  // Through parse_json, as every body: a refused body may be the one nested too deep.
  auto parsed = parse_json(body, "the request body");
  if (!parsed.is_ok() || !parsed->is_object()) {
    return;
  }
  const nlohmann::json& j = *parsed;
  auto it = j.find("ec_transfer_params");
  if (it == j.end() || !it->is_object()) {
    return;
  }
  auto items = ec_puller_->parse(*it);
  if (items.is_ok() && !items->empty()) {
    ec_puller_->release(*items);
  }
}

void OpenAiServer::handle_encode(const Request& request, std::shared_ptr<ResponseWriter> writer,
                                 std::shared_ptr<Call> call, bool chat) {
  if (!chat) {
    return send_json(
        *writer, 400,
        dump_json(error_json(bad_request(
            "this server is an image encoder (--role encode): it takes /v1/chat/completions "
            "requests with images and answers their ec_transfer_params; send completions to a "
            "prefill or colocated server"))));
  }
  if (call->request.images.empty()) {
    return send_json(*writer, 400,
                     dump_json(error_json(bad_request(
                         "this server is an image encoder (--role encode) and generates no "
                         "text, but the request has no images; send text-only requests to a "
                         "prefill or colocated server",
                         "messages"))));
  }
  std::string x_request_id = request.header("x-request-id");
  media_workers_->post([this, writer, call, x_request_id] {
    auto prepared = multimodal_->prepare(call->request.images);
    if (!prepared.is_ok()) {
      send_json(*writer, 400,
                dump_json(error_json(bad_request(prepared.status().message(), "messages"))));
      return;
    }
    const std::string id = "chatcmpl-" + (x_request_id.empty() ? random_uuid() : x_request_id);
    EncodeHandler::Reply reply =
        encoder_->encode(*prepared, id, options_.served_model_name, call->created);
    Headers headers;
    if (!x_request_id.empty()) {
      headers["X-Request-Id"] = x_request_id;
    }
    send_json(*writer, reply.http_status, dump_json(reply.body), std::move(headers));
  });
}

void OpenAiServer::start_generation(const Request& request, std::shared_ptr<ResponseWriter> writer,
                                    std::shared_ptr<Call> call, bool chat,
                                    std::vector<PreparedImage> images) {
  EngineClient* engine = call->engine;
  GenerationRequest& req = call->request;
  auto fail = [&](const ApiError& e) {
    if (req.kv_transfer.do_remote_prefill) {
      engine->release_refused_transfer(req.kv_transfer);
    }
    send_json(*writer, e.http_status, dump_json(error_json(e)));
  };

  // Prompt tokens.
  std::vector<int32_t> prompt;
  std::vector<engine::MultiModalItem> mm_items;
  if (chat) {
    std::vector<ChatMessage> messages = req.messages;
    auto rendered = engine->render_chat(messages, req.chat_render);
    if (!rendered.is_ok()) {
      return fail(bad_request("cannot apply the chat template: " + rendered.status().message(),
                              "messages"));
    }
    // The template already holds the special tokens (BOS) it wants.
    auto ids = engine->tokenize(*rendered, /*add_special_tokens=*/false);
    if (!ids.is_ok()) {
      return fail(bad_request(ids.status().message(), "messages"));
    }
    prompt = std::move(ids).value();
    if (multimodal_ != nullptr) {
      auto items = multimodal_->expand(prompt, images);
      if (!items.is_ok()) {
        return fail(bad_request(items.status().message(), "messages"));
      }
      mm_items = std::move(items).value();
    }
  } else if (req.prompt_text) {
    auto ids = engine->tokenize(*req.prompt_text, /*add_special_tokens=*/true);
    if (!ids.is_ok()) {
      return fail(bad_request(ids.status().message(), "prompt"));
    }
    prompt = std::move(ids).value();
  } else {
    prompt = *req.prompt_token_ids;
    for (int32_t id : prompt) {
      if (id >= engine->vocab_size()) {
        return fail(bad_request("token id " + std::to_string(id) + " is outside the vocabulary (" +
                                    std::to_string(engine->vocab_size()) + ")",
                                "prompt"));
      }
    }
  }
  if (prompt.empty()) {
    return fail(bad_request("the prompt is empty", chat ? "messages" : "prompt"));
  }
  int max_len = engine->max_model_len();
  int num_prompt = static_cast<int>(prompt.size());
  if (num_prompt >= max_len) {
    return fail(bad_request("This model's maximum context length is " + std::to_string(max_len) +
                                " tokens. However, your prompt has " + std::to_string(num_prompt) +
                                " tokens, which leaves no room for output.",
                            chat ? "messages" : "prompt"));
  }
  if (!req.max_tokens_given) {
    req.sampling.max_tokens =
        chat ? max_len - num_prompt
             : std::min(options_.default_completion_max_tokens, max_len - num_prompt);
  } else if (static_cast<int64_t>(num_prompt) + req.sampling.max_tokens > max_len) {
    return fail(
        bad_request("This model's maximum context length is " + std::to_string(max_len) +
                        " tokens. However, you requested " +
                        std::to_string(static_cast<int64_t>(num_prompt) + req.sampling.max_tokens) +
                        " tokens (" + std::to_string(num_prompt) + " in the prompt, " +
                        std::to_string(req.sampling.max_tokens) +
                        " for the completion). Please reduce the length.",
                    "max_tokens"));
  }

  if (req.sampling.min_tokens > req.sampling.max_tokens) {
    // As in the parser: a prefill server's one token is thrown away (see openai_protocol.cc).
    if (req.kv_transfer.do_remote_decode) {
      req.sampling.min_tokens = req.sampling.max_tokens;
    } else {
      return fail(bad_request("'min_tokens' (" + std::to_string(req.sampling.min_tokens) +
                                  ") must not be greater than 'max_tokens' (" +
                                  std::to_string(req.sampling.max_tokens) +
                                  (req.max_tokens_given ? "" : ", the default for this prompt") +
                                  ")",
                              "min_tokens"));
    }
  }
  for (const auto& token_bias : req.sampling.logit_bias) {
    if (const int32_t id = token_bias.first; id >= engine->vocab_size()) {
      return fail(bad_request("'logit_bias' token id " + std::to_string(id) +
                                  " is outside the vocabulary (" +
                                  std::to_string(engine->vocab_size()) + ")",
                              "logit_bias"));
    }
  }

  SubmitOptions submit_options;
  submit_options.kv_transfer = req.kv_transfer;
  submit_options.mm_items = std::move(mm_items);
  if (std::string rank = request.header("x-data-parallel-rank"); !rank.empty()) {
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(rank.c_str(), &end, 10);
    if (errno != 0 || end == rank.c_str() || *end != '\0' || value < 0 || value > 1'000'000) {
      return fail(bad_request("header X-data-parallel-rank must be a non-negative integer, got '" +
                              rank + "'"));
    }
    submit_options.data_parallel_rank = static_cast<int>(value);
  }

  call->x_request_id = request.header("x-request-id");
  uint64_t number = next_request_number_.fetch_add(1);
  std::string base = call->x_request_id.empty() ? random_uuid() : call->x_request_id;
  call->response_id = (chat ? "chatcmpl-" : "cmpl-") + base;
  // Unique even when a client reuses an X-Request-Id.
  call->engine_id = base + "#" + std::to_string(number);
  std::vector<std::shared_ptr<Call>> calls = Call::make_choices(call, tool_parser_.get());
  Call::Group& group = *call->group;

  num_in_flight_.fetch_add(static_cast<int>(calls.size()));
  // Outputs wait for the stream's headers: on_output takes this lock too.
  std::unique_lock<std::mutex> lock(group.mu);
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::shared_ptr<Call>& c = calls[i];
    const bool is_last = i + 1 == calls.size();
    Status s =
        engine->submit(c->engine_id, is_last ? std::move(prompt) : prompt, c->request.sampling,
                       is_last ? std::move(submit_options) : submit_options,
                       [this, c](const GenerationOutput& out) { on_output(c, out); });
    if (s.is_ok()) {
      continue;
    }
    // The choices already submitted are aborted (outside the lock: an abort may report at
    // once); their outputs find submit_failed and are dropped.
    group.submit_failed = true;
    num_in_flight_.fetch_sub(static_cast<int>(calls.size() - i));
    lock.unlock();
    for (size_t k = 0; k < i; ++k) {
      engine->abort(calls[k]->engine_id);
    }
    if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kAlreadyExists) {
      return fail(bad_request(s.message()));
    }
    return fail(api_error(503, s.message(), "service_unavailable"));
  }
  Headers headers;
  if (!call->x_request_id.empty()) {
    headers["X-Request-Id"] = call->x_request_id;
  }
  if (req.stream) {
    metrics_.observe_http_request(200);
    headers["Cache-Control"] = "no-cache";
    writer->start_stream(200, "text/event-stream", std::move(headers));
  }
  // A client that goes away aborts its request; the engine frees its blocks at once.
  std::vector<std::string> ids;
  for (const auto& c : calls) {
    ids.push_back(c->engine_id);
  }
  writer->on_close([engine, ids = std::move(ids)] {
    for (const std::string& id : ids) {
      engine->abort(id);
    }
  });
}

std::vector<std::shared_ptr<OpenAiServer::Call>> OpenAiServer::Call::make_choices(
    const std::shared_ptr<Call>& first, const ToolParser* tool_parser) {
  const GenerationRequest& req = first->request;
  const int num_choices = std::max(req.n, req.best_of);
  const auto num = static_cast<size_t>(num_choices);
  first->group->num_choices = num_choices;
  first->group->choices.resize(num);
  first->group->cumulative_logprobs.resize(num);
  first->group->num_tokens.resize(num);
  std::vector<std::shared_ptr<Call>> calls = {first};
  for (int i = 1; i < num_choices; ++i) {
    auto c = std::make_shared<Call>();
    c->group = first->group;
    c->index = i;
    c->request = req;
    // vLLM's rule: with a seed, choice i samples with seed + i, so the choices differ and the
    // whole answer is still reproducible.
    if (req.sampling.seed.has_value()) {
      c->request.sampling.seed = *req.sampling.seed + static_cast<uint64_t>(i);
    }
    c->engine_id = first->engine_id + "/" + std::to_string(i);
    c->response_id = first->response_id;
    c->x_request_id = first->x_request_id;
    c->created = first->created;
    c->arrival_ns = first->arrival_ns;
    c->writer = first->writer;
    c->engine = first->engine;
    c->parses_tool_calls = first->parses_tool_calls;
    c->forces_tool_calls = first->forces_tool_calls;
    if (c->parses_tool_calls && req.stream) {
      c->tool_streamer = tool_parser->start_stream();
    }
    calls.push_back(std::move(c));
  }
  return calls;
}

// best_of: keeps the n choices with the highest cumulative logprob, best first, indexed 0..n-1
// (vLLM's order). Returns the output tokens of the choices kept (what usage reports).
int OpenAiServer::Call::keep_best_choices(int n, Group* group) {
  if (group->num_choices == n) {
    return group->num_output_tokens;
  }
  std::vector<size_t> order(group->choices.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return group->cumulative_logprobs[a] > group->cumulative_logprobs[b];
  });
  std::vector<json> best;
  int num_tokens = 0;
  for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
    json choice = std::move(group->choices[order[k]]);
    choice["index"] = k;
    best.push_back(std::move(choice));
    num_tokens += group->num_tokens[order[k]];
  }
  group->choices = std::move(best);
  return num_tokens;
}

void OpenAiServer::on_output(const std::shared_ptr<Call>& call, const GenerationOutput& out) {
  std::lock_guard<std::mutex> lock(call->group->mu);
  Call::Group& group = *call->group;
  if (group.submit_failed) {
    if (out.finished) {
      num_in_flight_.fetch_sub(1);
    }
    return;
  }
  const GenerationRequest& req = call->request;
  bool chat = req.endpoint == Endpoint::kChat;
  if (!out.new_token_ids.empty()) {
    const int64_t t = now_ns();
    if (call->first_token_ns == 0) {
      call->first_token_ns = t;
    } else {
      metrics_.observe_inter_token(static_cast<double>(t - call->last_token_ns) * 1e-9);
    }
    call->last_token_ns = t;
  }
  // Observed before the final response is written, so /metrics read after it includes it.
  if (out.finished) {
    int64_t end_ns = now_ns();
    double e2e = static_cast<double>(end_ns - call->arrival_ns) * 1e-9;
    double ttft = call->first_token_ns == 0
                      ? e2e
                      : static_cast<double>(call->first_token_ns - call->arrival_ns) * 1e-9;
    metrics_.observe_finished(out.finish_reason, ttft, e2e, out.num_output_tokens);
  }
  // Logprobs of this output in the endpoint's shape (null unless asked for).
  json output_logprobs = req.want_logprobs
                             ? shape_logprobs(*call->engine, out.logprobs, chat, &call->text_offset)
                             : json(nullptr);
  json finish_reason = out.finished
                           ? json(out.finish_reason == "error" ? "abort" : out.finish_reason)
                           : json(nullptr);
  json stop_reason = nullptr;
  if (!out.stop_reason.empty()) {
    stop_reason = out.stop_reason;
  } else if (out.stop_token_id >= 0) {
    stop_reason = out.stop_token_id;
  }
  ResponseWriter& writer = *call->writer;

  if (req.stream) {
    // num_output_tokens: the running count continuous_usage_stats reports in this chunk.
    auto chunk = [&](json choices, int num_output_tokens) {
      json c = {{"id", call->response_id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", call->created},
                {"model", options_.served_model_name},
                {"choices", std::move(choices)}};
      if (req.continuous_usage_stats) {
        c["usage"] = usage_json(out.num_prompt_tokens, num_output_tokens, out.num_cached_tokens);
      } else if (req.include_usage) {
        c["usage"] = nullptr;
      }
      return c;
    };
    auto send_event = [&](const json& j) { writer.write("data: " + dump_json(j) + "\n\n"); };
    if (chat && !call->sent_first_chunk) {
      call->sent_first_chunk = true;
      send_event(chunk(json::array({{{"index", call->index},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}}),
                       0));
    }
    if (out.finished && out.finish_reason == "error") {
      send_event(error_json(generation_error(out, req.kv_transfer)));
    } else if (!out.new_text.empty() || !out.new_token_ids.empty() || out.finished) {
      // Chat: the deltas of this output in order (content, then each call that completed);
      // logprobs go on the first, the finish reason on the last.
      std::vector<json> deltas;
      if (chat && call->forces_tool_calls) {
        call->append_forced_call_deltas(out, &deltas);
      } else if (chat && call->tool_streamer != nullptr) {
        ToolStreamDelta d = call->tool_streamer->push(out.new_text, /*is_end=*/out.finished);
        if (!d.content.empty()) {
          deltas.push_back({{"content", std::move(d.content)}});
        }
        if (!req.parallel_tool_calls) {
          d.calls.resize(std::min<size_t>(d.calls.size(), call->num_tool_calls_sent > 0 ? 0 : 1));
        }
        append_tool_call_deltas(d.calls, &call->num_tool_calls_sent, &deltas);
        if (call->num_tool_calls_sent > 0) {
          finish_reason = finish_reason_with_calls(finish_reason);
        }
      } else if (chat && !out.new_text.empty()) {
        deltas.push_back({{"content", out.new_text}});
      }
      if (deltas.empty()) {
        deltas.push_back(json::object());
      }
      const size_t num_chunks = chat ? deltas.size() : 1;
      for (size_t i = 0; i < num_chunks; ++i) {
        const bool is_last = i + 1 == num_chunks;
        json choice = {{"index", call->index},
                       {"logprobs", i == 0 ? output_logprobs : json(nullptr)},
                       {"finish_reason", is_last ? finish_reason : json(nullptr)}};
        if (chat) {
          choice["delta"] = std::move(deltas[i]);
        } else {
          choice["text"] = out.new_text;
          choice["stop_reason"] = stop_reason;
        }
        json c = chunk(json::array({choice}), out.num_output_tokens);
        if (is_last && out.finished && req.kv_transfer_params) {
          c["kv_transfer_params"] = *req.kv_transfer_params;
        }
        send_event(c);
      }
    }
    if (out.finished) {
      group.num_output_tokens += out.num_output_tokens;
      if (++group.num_finished == group.num_choices) {
        if (req.include_usage) {
          json c = chunk(json::array(), group.num_output_tokens);
          c["usage"] =
              usage_json(out.num_prompt_tokens, group.num_output_tokens, out.num_cached_tokens);
          send_event(c);
        }
        writer.write("data: [DONE]\n\n");
        writer.end();
      }
    }
  } else {
    call->text += out.new_text;
    for (const auto& lp : out.logprobs) {
      call->logprobs.push_back(lp);
    }
    if (out.finished) {
      group.num_output_tokens += out.num_output_tokens;
      ++group.num_finished;
      if (out.finish_reason == "error") {
        // The first failing choice answers for the request; the others' outputs are dropped.
        if (!group.failed) {
          group.failed = true;
          ApiError error = generation_error(out, req.kv_transfer);
          send_json(writer, error.http_status, dump_json(error_json(error)));
        }
      } else if (!group.failed) {
        size_t offset = 0;
        json all_logprobs = req.want_logprobs
                                ? shape_logprobs(*call->engine, call->logprobs, chat, &offset)
                                : json(nullptr);
        json choice = {{"index", call->index},
                       {"logprobs", all_logprobs},
                       {"finish_reason", finish_reason},
                       {"stop_reason", stop_reason}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", call->text}};
          if (call->forces_tool_calls) {
            // vLLM's shape: empty content beside the calls. Output that is not the calls'
            // JSON (cut by max_tokens or a stop string) stays content.
            if (auto calls = forced_tool_calls(req, call->text)) {
              choice["message"]["content"] = "";
              choice["message"]["tool_calls"] = json::array();
              for (const ToolCall& c : *calls) {
                choice["message"]["tool_calls"].push_back(tool_call_json(c));
              }
            }
          } else if (call->parses_tool_calls) {
            ExtractedToolCalls parsed = tool_parser_->extract(call->text);
            if (!req.parallel_tool_calls && parsed.calls.size() > 1) {
              parsed.calls.resize(1);
            }
            if (!parsed.calls.empty()) {
              choice["message"]["content"] = parsed.content ? json(*parsed.content) : json(nullptr);
              json calls = json::array();
              for (const ToolCall& c : parsed.calls) {
                calls.push_back(tool_call_json(c));
              }
              choice["message"]["tool_calls"] = std::move(calls);
              choice["finish_reason"] = finish_reason_with_calls(finish_reason);
            }
          }
        } else {
          choice["text"] = call->text;
        }
        const auto index = static_cast<size_t>(call->index);
        group.choices[index] = std::move(choice);
        group.num_tokens[index] = out.num_output_tokens;
        for (const auto& lp : call->logprobs) {
          group.cumulative_logprobs[index] += lp.sampled.logprob;
        }
      }
      if (group.num_finished == group.num_choices && !group.failed) {
        const int num_output_tokens = Call::keep_best_choices(req.n, &group);
        json body = {
            {"id", call->response_id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", call->created},
            {"model", options_.served_model_name},
            {"choices", std::move(group.choices)},
            {"usage", usage_json(out.num_prompt_tokens, num_output_tokens, out.num_cached_tokens)}};
        body["kv_transfer_params"] =
            req.kv_transfer_params ? *req.kv_transfer_params : json(nullptr);
        Headers headers;
        if (!call->x_request_id.empty()) {
          headers["X-Request-Id"] = call->x_request_id;
        }
        send_json(writer, 200, dump_json(body), std::move(headers));
      }
    }
  }
  if (out.finished) {
    num_in_flight_.fetch_sub(1);
  }
}

}  // namespace crescent::server
