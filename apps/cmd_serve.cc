// `crescent serve`: engines behind the OpenAI-compatible HTTP server (vLLM's flag names), as
// one colocated engine (--role both) or one side of prefill/decode disaggregation (--role
// prefill|decode, see docs/disagg.md), with a graceful SIGTERM drain.

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "apps/command.h"
#include "apps/ec_flags.h"
#include "apps/flags.h"
#include "apps/model_flags.h"
#include "apps/multimodal_flags.h"
#include "apps/serve_deployment.h"
#include "bootstrap/etcd_client.h"
#include "bootstrap/etcd_members.h"
#include "core/clock.h"
#include "core/ids.h"
#include "net/http/api_key.h"
#include "proxy/proxy_options.h"
#include "server/openai_server.h"
#include "server/tool_parsers/tool_parser.h"

namespace crescent::apps {
namespace {

// Takes SIGTERM/SIGINT on its own thread. Before the server is ready (loading the model,
// waiting for a bootstrap server) nothing is in flight, so a signal ends the process at once
// instead of after the load or the registration retries; afterwards it starts the drain.
class SignalWatcher {
 public:
  explicit SignalWatcher(sigset_t signals) : signals_(signals) {
    std::thread([this] { watch(); }).detach();
  }
  // From here on a signal drains instead of exiting.
  void set_ready() {
    std::lock_guard<std::mutex> lock(mu_);
    is_ready_ = true;
  }
  // Blocks until a signal arrived after set_ready(); returns it.
  int wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return signal_ != 0; });
    return signal_;
  }

 private:
  void watch() {
    int signal_number = 0;
    sigwait(&signals_, &signal_number);
    std::lock_guard<std::mutex> lock(mu_);
    if (!is_ready_) {
      std::printf("crescent serve: %s before ready, exiting\n",
                  signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
      std::fflush(stdout);
      std::_Exit(0);
    }
    signal_ = signal_number;
    cv_.notify_all();
  }

  sigset_t signals_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool is_ready_ = false;  // GUARDED_BY(mu_)
  int signal_ = 0;         // GUARDED_BY(mu_)
};

struct ServeFlags {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int io_threads = 2;
  int64_t max_body_mb = 32;
  double drain_timeout_s = 30;
  bool enable_auto_tool_choice = false;
  bool vllm_metric_names = false;
  std::string tool_call_parser;
  std::string api_key;
  std::string cluster;        // --cluster etcd://HOST:PORT/CLUSTER; "" publishes nothing
  std::string advertise_url;  // --advertise-url; "" : http://HOST:PORT from --host and --port

  void add_to(FlagParser& flags) {
    flags.add("cluster", &cluster,
              "etcd://HOST:PORT/CLUSTER: publish this worker (role, --advertise-url, and a "
              "prefill's bootstrap address) as CLUSTER/members/ROLE/ID under a lease of "
              "--bootstrap-lease-ttl, so that `crescent proxy --discover` with the same url "
              "routes to it; the key goes at SIGTERM, or when the lease expires after a crash");
    flags.add("advertise-url", &advertise_url,
              "with --cluster: the http://HOST:PORT the proxy calls this worker at (default: "
              "http://--host:--port; required when --host is 0.0.0.0 or ::, or --port is 0)");
    flags.add("host", &host, "address to listen on");
    flags.add("port", &port, "port to listen on (0: any free port, printed at start)");
    flags.add("served-model-name", &served_model_name,
              "the model name the API reports and accepts (default: the model's name)");
    flags.add("io-threads", &io_threads, "HTTP I/O threads");
    flags.add("max-body-mb", &max_body_mb, "largest request body accepted (larger: 413)");
    flags.add("drain-timeout-s", &drain_timeout_s,
              "on SIGTERM, how long in-flight requests may take to finish before they are aborted");
    flags.add("enable-auto-tool-choice", &enable_auto_tool_choice,
              "answer chat requests with tools and tool_choice \"auto\" (the default when tools "
              "are given) with the tool calls parsed from the output; needs --tool-call-parser");
    flags.add("tool-call-parser", &tool_call_parser,
              "how tool calls are written in the model's output: hermes (Qwen2.5, Qwen3, "
              "Hermes) or llama3_json (Llama 3.1/3.2 JSON tool calling)");
    flags.add("vllm-metric-names", &vllm_metric_names,
              "also export /metrics under vLLM's names and labels (vllm:num_requests_running, "
              "vllm:kv_cache_usage_perc, vllm:time_to_first_token_seconds, ...) for dashboards "
              "and routers written for vLLM; promtool's lint flags the ':' in them, as it does on "
              "vLLM's own /metrics");
    flags.add("api-key", &api_key,
              "clients must send 'Authorization: Bearer KEY' (compared in constant time; else "
              "401) on every path but /health, /metrics and /version, which stay open for health "
              "checks and scrapes (vLLM's --api-key). Default: $CRESCENT_API_KEY if set, else no "
              "key. A key on the command line shows in `ps`: prefer the variable");
  }

  // vLLM's rule: the flag without a parser cannot work, so it stops the start.
  Status validate() {
    const char* from_env = std::getenv("CRESCENT_API_KEY");
    if (api_key.empty() && from_env != nullptr && *from_env != '\0') {
      api_key = from_env;  // vLLM's VLLM_API_KEY rule: the flag wins, empty is no key
    }
    if (!api_key.empty()) {
      if (Status s = net::http::ApiKeyCheck::make(api_key).status(); !s.is_ok()) {
        return invalid_argument("--api-key (or CRESCENT_API_KEY): " + s.message());
      }
    }
    if (enable_auto_tool_choice && tool_call_parser.empty()) {
      return invalid_argument("--enable-auto-tool-choice needs --tool-call-parser (" +
                              server::tool_parser_names() + ")");
    }
    if (!tool_call_parser.empty()) {
      RETURN_IF_ERROR(server::make_tool_parser(tool_call_parser).status());
    }
    if (!advertise_url.empty() && cluster.empty()) {
      return invalid_argument(
          "--advertise-url says where the proxy finds this worker; it needs "
          "--cluster");
    }
    if (!cluster.empty()) {
      if (!bootstrap::is_etcd_url(cluster)) {
        return invalid_argument("--cluster expects etcd://HOST:PORT[/CLUSTER], got '" + cluster +
                                "'");
      }
      if (auto url = bootstrap::parse_etcd_url(cluster); !url.is_ok()) {
        return invalid_argument("--cluster: " + url.status().message());
      }
      if (advertise_url.empty()) {
        if (host == "0.0.0.0" || host == "::" || port == 0) {
          return invalid_argument(
              "--cluster with --host " + host + " --port " + std::to_string(port) +
              " needs --advertise-url http://HOST:PORT (where the proxy reaches this worker)");
        }
        advertise_url = "http://" +
                        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                        std::to_string(port);
      }
      if (auto url = proxy::parse_upstream_url(advertise_url); !url.is_ok()) {
        return invalid_argument("--advertise-url: " + url.status().message());
      } else {
        advertise_url = url->url;
      }
    }
    return Status::ok();
  }
};

int run_serve(const std::vector<std::string>& args) {
  ModelFlags model_flags;
  ServeFlags serve;
  DisaggFlags disagg;
  MultimodalFlags multimodal;
  EcFlags ec;
  FlagParser flags(
      "crescent serve --model DIR|FILE [--role both|prefill|decode|encode] [--host 127.0.0.1] "
      "[--port 8000] [--served-model-name N] [--kv-transport shm|tcp|ucx] "
      "[--kv-transfer-timeout S] [--bootstrap-port 8998 | --bootstrap-addr URL] "
      "[--bootstrap-lease-ttl 10] [--auth-token-file FILE] "
      "[--cluster etcd://HOST:PORT/CLUSTER [--advertise-url URL]] "
      "[--data-parallel-size N] [--max-model-len N] [--max-num-seqs N] [--threads N] "
      "[--chat-template FILE|STRING] [--enable-auto-tool-choice --tool-call-parser "
      "hermes|llama3_json] [--api-key KEY]",
      "Serves one model over the OpenAI HTTP API: /v1/completions, /v1/chat/completions,\n"
      "/v1/models[/{id}], /tokenize, /detokenize (vLLM's), /v1/kv_events (the prefix cache's\n"
      "stored/evicted block hashes, for `crescent proxy --router kv_aware`), /health (503 until\n"
      "loaded), /metrics (Prometheus). SIGTERM or SIGINT stop\n"
      "accepting, let requests finish for --drain-timeout-s, abort the rest and exit 0.\n"
      "\n"
      "Security: the server listens on 127.0.0.1 unless --host says otherwise. --api-key (or\n"
      "CRESCENT_API_KEY) guards the OpenAI API. --auth-token-file (or CRESCENT_AUTH_TOKEN)\n"
      "makes the KV/EC control and transfer listeners of --role prefill|decode|encode\n"
      "authenticate peers by challenge-response, and the bootstrap server refuse unsigned\n"
      "registrations; without it they accept anyone who reaches their port. See\n"
      "docs/deployment.md.\n"
      "\n"
      "Chat: messages are rendered with the model's chat template (or --chat-template's) as\n"
      "transformers renders them; requests may send chat_template, chat_template_kwargs (e.g.\n"
      "{\"enable_thinking\": false}), add_generation_prompt, continue_final_message, roles the\n"
      "template knows (developer, tool) and assistant tool_calls. tools always reach the\n"
      "template; with tool_choice \"auto\" (the default when tools are given) the server needs\n"
      "--enable-auto-tool-choice and --tool-call-parser, and answers with the calls parsed\n"
      "from the output as tool_calls (streamed too); \"required\" and a named function are\n"
      "refused (no guided decoding yet). See docs/server.md.\n"
      "\n"
      "Disaggregation: start `--role prefill` (hosts the bootstrap server on --bootstrap-port)\n"
      "and `--role decode`, then `crescent proxy --prefill URL BOOTSTRAP_PORT --decode URL`.\n"
      "Requests carry kv_transfer_params (the proxy adds them); the decode engine fetches the\n"
      "prompt's KV from the prefill engine and decodes. See docs/disagg.md.\n"
      "\n"
      "Images: a Qwen2-VL / Qwen2.5-VL model (an HF checkout, or a GGUF with --mmproj) takes\n"
      "chat content parts {\"type\": \"image_url\", \"image_url\": {\"url\": ...}} with data:\n"
      "URLs, file:// URLs under --allowed-local-media-path, and http:// URLs with\n"
      "--allow-remote-media. See docs/multimodal.md.\n"
      "\n"
      "EPD: `--role encode` loads only a VL model's vision tower; its answer to a chat request\n"
      "with images is a chat.completion without text carrying ec_transfer_params, which a\n"
      "--role prefill|both server of the same model takes to pull the embeddings instead of\n"
      "encoding (--ec-* flags). `crescent proxy --encode URL` does this for clients.");
  model_flags.add_to(flags);
  serve.add_to(flags);
  disagg.add_to(flags);
  multimodal.add_to(flags);
  ec.add_to(flags);
  if (int code = flags.parse_or_exit_code(args); code >= 0) {
    return code;
  }
  if (Status s = serve.validate(); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = disagg.validate(); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = ec.validate(disagg.role); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  // Every thread started from here on inherits the mask; the main thread takes the signals
  // with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Never destroyed: its detached thread may run until the process exits.
  static auto* signal_watcher = new SignalWatcher(signals);

  // Filled once the engines exist; /metrics reads it from the server's threads.
  std::atomic<ServeDeployment*> deployment_for_metrics{nullptr};
  server::OpenAiServerOptions options;
  options.http.host = serve.host;
  options.http.port = serve.port;
  options.http.num_io_threads = std::max(1, serve.io_threads);
  options.http.max_body_bytes = static_cast<uint64_t>(std::max<int64_t>(1, serve.max_body_mb))
                                << 20;
  options.served_model_name = serve.served_model_name;
  options.enable_auto_tool_choice = serve.enable_auto_tool_choice;
  options.vllm_metric_names = serve.vllm_metric_names;
  options.tool_call_parser = serve.tool_call_parser;
  options.api_key = serve.api_key;
  if (options.served_model_name.empty()) {
    std::string m = model_flags.model;
    while (m.size() > 1 && m.back() == '/') {
      m.pop_back();
    }
    options.served_model_name = m;
  }
  options.extra_metrics = [&deployment_for_metrics,
                           name = options.served_model_name](std::string* out) {
    if (ServeDeployment* d = deployment_for_metrics.load()) {
      d->render_metrics(name, out);
    }
  };
  auto server_or = server::OpenAiServer::start(options);
  if (!server_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().to_string().c_str());
    return 1;
  }
  auto& server = *server_or;
  std::printf(
      "crescent serve: listening on http://%s:%d (loading %s, role %s, API key %s)\n",
      serve.host.c_str(), server->port(), model_flags.model.c_str(), disagg.role.c_str(),
      serve.api_key.empty() ? "off" : "required (open: /health, /metrics, /version, /ping)");
  std::fflush(stdout);

  auto deployment_or = ServeDeployment::start(model_flags, disagg, ec, serve.host);
  if (!deployment_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", deployment_or.status().to_string().c_str());
    return 1;
  }
  auto& deployment = *deployment_or;
  auto processor = multimodal.make_processor(deployment->loaded());
  if (!processor.is_ok()) {
    std::fprintf(stderr, "error: %s\n", processor.status().to_string().c_str());
    return 2;
  }
  server->set_multimodal(*processor);
  if (server::EcFetcher* fetcher = deployment->ec_fetcher()) {
    const engine::LoadedEngine& loaded = deployment->loaded();
    server::EcPullOptions pull;
    pull.fallback_local = ec.ec_fallback_local && loaded.is_multimodal();
    pull.hidden_size = loaded.config.vision->out_hidden_size;
    server->set_ec_puller(std::make_unique<server::EcImagePuller>(fetcher, pull));
  }
  server::EngineClient* client = deployment->client();
  deployment_for_metrics.store(deployment.get());
  signal_watcher->set_ready();
  if (deployment->role() == ServeRole::kEncode) {
    server->set_encoder(
        std::make_unique<server::EncodeHandler>(deployment->encoder(), deployment->ec_publisher()));
  } else {
    server->set_engine(client);
  }
  // Another engine took this one's place at the bootstrap (docs/bootstrap.md, fencing): stop
  // serving, so that /health answers 503 and the proxy routes around this process. The engine
  // stays alive for the requests already in flight.
  deployment->set_on_fenced([srv = server.get()](const std::string& reason) {
    std::fprintf(stderr, "crescent serve: fenced out, no longer serving: %s\n", reason.c_str());
    std::fflush(stderr);
    srv->set_unavailable("fenced out at the bootstrap: " + reason);
  });
  if (!deployment->bootstrap_url().empty()) {
    std::printf("crescent serve: bootstrap %s\n", deployment->bootstrap_url().c_str());
  }
  // Published once the engine serves, so the proxy never routes to a worker still loading.
  std::unique_ptr<bootstrap::MemberPublisher> member;
  if (!serve.cluster.empty()) {
    bootstrap::ClusterMember m;
    m.url = serve.advertise_url;
    m.role = disagg.role;
    m.bootstrap = deployment->role() == ServeRole::kPrefill ? deployment->bootstrap_url() : "";
    // A hosted bootstrap server listens on --host: the proxy reaches it at the advertised host.
    auto hosted = proxy::parse_upstream_url(m.bootstrap);
    auto advertised = proxy::parse_upstream_url(m.url);  // checked by validate()
    if (hosted.is_ok() && advertised.is_ok() &&
        (hosted->host == "0.0.0.0" || hosted->host == "::")) {
      hosted->host = advertised->host;
      m.bootstrap = "http://" + hosted->host_port();
    }
    m.engine_id = disagg.role + "-" + random_uuid();
    auto published = bootstrap::MemberPublisher::start(
        serve.cluster, m,
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(disagg.bootstrap_lease_ttl_s))));
    if (!published.is_ok()) {
      std::fprintf(stderr, "error: --cluster %s: %s\n", serve.cluster.c_str(),
                   published.status().to_string().c_str());
      return 1;
    }
    member = std::move(published).value();
    std::printf("crescent serve: member %s of cluster %s\n", m.engine_id.c_str(),
                serve.cluster.c_str());
  }
  std::printf("%s", deployment->describe().c_str());
  if (client != nullptr) {
    std::printf("crescent serve: ready, model '%s', max_model_len %d\n",
                options.served_model_name.c_str(), client->max_model_len());
  } else {
    std::printf("crescent serve: ready, model '%s', image encoder only\n",
                options.served_model_name.c_str());
  }
  std::fflush(stdout);

  int signal_number = signal_watcher->wait();
  std::printf("crescent serve: %s, draining %d request(s)\n",
              signal_number == SIGTERM ? "SIGTERM" : "SIGINT", server->num_in_flight());
  std::fflush(stdout);
  if (member) {
    member->stop();  // leaves the cluster first: the proxy sends nothing new
  }
  server->begin_drain();
  auto deadline = Deadline::after(
      std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, serve.drain_timeout_s) * 1000)));
  while (server->num_in_flight() > 0 && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int num_aborted = server->num_in_flight();
  // Aborts the rest: each gets its final "abort" output, which ends its response.
  deployment->shutdown();
  auto flush_deadline = Deadline::after_ms(2000);
  while (server->num_in_flight() > 0 && !flush_deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server->stop();
  deployment_for_metrics.store(nullptr);
  std::printf("crescent serve: stopped (%d request(s) aborted)\n", num_aborted);
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(serve, "serve", "serve a model over the OpenAI HTTP API", run_serve)
}  // namespace crescent::apps
