#include "bench/bench_serve.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "bench/arrivals.h"
#include "bench/chart.h"
#include "bench/dataset.h"
#include "bench/load_generator.h"
#include "bench/openai_request.h"
#include "bench/progress_bar.h"
#include "bench/report.h"
#include "bench/server_tokenizer.h"
#include "core/ids.h"
#include "net/http/http_client.h"

namespace crescent::bench {

using json = nlohmann::json;

namespace {

std::vector<std::string> split(std::string_view text, std::string_view separators) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : text) {
    if (separators.find(c) != std::string_view::npos) {
      if (!current.empty()) {
        parts.push_back(current);
      }
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) {
    parts.push_back(current);
  }
  return parts;
}

Result<double> parse_number(const std::string& text, const std::string& what) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || std::isnan(v)) {
    return invalid_argument(what + " expects a number, got '" + text + "'");
  }
  return v;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string now_date() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%d-%H%M%S", &tm);
  return text;
}

Status write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) {
    return not_found("cannot write " + path);
  }
  f << content;
  f.close();
  if (!f) {
    return data_loss("writing " + path + " failed");
  }
  return Status::ok();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return not_found("cannot open " + path);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Polls GET /v1/models once a second until it answers 200 or `timeout_s` has passed.
Status wait_until_ready(const ServerAddress& address, double timeout_s, FILE* out) {
  const Deadline deadline = Deadline::after_ms(static_cast<int64_t>(timeout_s * 1000));
  net::http::HttpClient client(address.host, address.port);
  std::string last_error;
  bool said_waiting = false;
  for (;;) {
    auto response = client.request("GET", address.path_prefix + "/v1/models", "", {},
                                   Deadline::after_ms(5'000));
    if (response.is_ok() && response->status == 200) {
      return Status::ok();
    }
    last_error = response.is_ok() ? "HTTP " + std::to_string(response->status) + ": " +
                                        response->body.substr(0, 200)
                                  : response.status().message();
    if (deadline.is_expired()) {
      break;
    }
    if (!said_waiting) {
      std::fprintf(out, "Waiting for %s to be ready (up to %.0f s)...\n", address.url().c_str(),
                   timeout_s);
      std::fflush(out);
      said_waiting = true;
    }
    client.close();
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return unavailable("GET " + address.url() + "/v1/models did not answer 200 within " +
                     python_float(timeout_s) + " s (--ready-check-timeout-sec): " + last_error);
}

// The id of the first model the server lists, as vLLM's bench does without --model.
Result<std::string> first_served_model(const ServerAddress& address) {
  net::http::HttpClient client(address.host, address.port);
  auto response =
      client.request("GET", address.path_prefix + "/v1/models", "", {}, Deadline::after_ms(30'000));
  if (!response.is_ok()) {
    return response.status().with_context("GET " + address.url() + "/v1/models");
  }
  if (response->status != 200) {
    return unavailable("GET " + address.url() + "/v1/models answered HTTP " +
                       std::to_string(response->status) + ": " + response->body.substr(0, 300));
  }
  json j = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return unavailable("no model listed by " + address.url() +
                       "/v1/models; pass --served-model-name");
  }
  return j["data"][0]["id"].get<std::string>();
}

RandomMultiModalOptions random_mm_options(const BenchServeOptions& o) {
  RandomMultiModalOptions mm;
  mm.base_items_per_request = o.random_mm_base_items_per_request;
  mm.num_mm_items_range_ratio = o.random_mm_num_mm_items_range_ratio;
  mm.image_limit = o.random_mm_image_limit;
  mm.buckets = o.random_mm_buckets;
  mm.seed = o.seed;
  return mm;
}

Result<std::vector<SampleRequest>> make_prompts(const BenchServeOptions& o,
                                                const PromptTokenizer& tokenizer) {
  if (o.dataset_name == "random" || o.dataset_name == "random-mm") {
    RandomDatasetOptions r;
    r.input_len = o.random_input_len;
    r.output_len = o.random_output_len;
    r.range_ratio = o.random_range_ratio;
    r.prefix_len = o.random_prefix_len;
    r.num_prefixes = o.random_num_prefixes;
    r.seed = o.seed;
    return sample_random(tokenizer, o.num_prompts, r);
  }
  if (o.dataset_name == "prefix_repetition") {
    PrefixRepetitionOptions r = o.prefix_repetition;
    r.seed = o.seed;
    return sample_prefix_repetition(tokenizer, o.num_prompts, r);
  }
  ASSIGN_OR_RETURN(std::string text, read_file(o.dataset_path));
  ShareGptOptions s;
  s.output_len = o.sharegpt_output_len;
  s.seed = o.seed;
  auto samples = sample_sharegpt(tokenizer, text, o.num_prompts, s);
  if (!samples.is_ok()) {
    return samples.status().with_context(o.dataset_path);
  }
  return samples;
}

std::string chart_title(const RunInfo& info, const BenchmarkMetrics& m, double duration_s) {
  char text[512];
  std::snprintf(
      text, sizeof(text), "%s | %s | %s req/s, burstiness %s, %s | %lld ok, %lld failed in %.1f s",
      info.model_id.c_str(), info.dataset_name.c_str(), python_float(info.request_rate).c_str(),
      python_float(info.burstiness).c_str(),
      info.max_concurrency > 0 ? ("max concurrency " + std::to_string(info.max_concurrency)).c_str()
                               : "no concurrency limit",
      static_cast<long long>(m.completed), static_cast<long long>(m.failed), duration_s);
  return text;
}

}  // namespace

Result<GoodputSlos> parse_goodput(std::string_view text) {
  GoodputSlos slos;
  for (const std::string& pair : split(text, " ,")) {
    size_t colon = pair.find(':');
    if (colon == std::string::npos) {
      return invalid_argument("--goodput expects KEY:VALUE pairs (e.g. ttft:100 tpot:50), got '" +
                              pair + "'");
    }
    std::string key = pair.substr(0, colon);
    if (key != "ttft" && key != "tpot" && key != "e2el" && key != "itl") {
      return invalid_argument("--goodput: unknown metric '" + key +
                              "' (the SLO metrics are ttft, tpot, e2el, itl)");
    }
    ASSIGN_OR_RETURN(double ms, parse_number(pair.substr(colon + 1), "--goodput " + key));
    if (ms < 0) {
      return invalid_argument("--goodput " + key + " must be >= 0 ms, got " + python_float(ms));
    }
    slos[key] = ms;
  }
  if (slos.empty()) {
    return invalid_argument("--goodput needs at least one KEY:VALUE pair");
  }
  return slos;
}

Result<std::vector<std::string>> parse_percentile_metrics(std::string_view text) {
  std::vector<std::string> metrics;
  for (const std::string& m : split(text, ",")) {
    if (std::find(std::begin(kMetricKeys), std::end(kMetricKeys), m) == std::end(kMetricKeys)) {
      return invalid_argument("--percentile-metrics: unknown metric '" + m +
                              "' (choose from ttft, tpot, itl, e2el)");
    }
    metrics.push_back(m);
  }
  if (metrics.empty()) {
    return invalid_argument("--percentile-metrics is empty");
  }
  return metrics;
}

Result<std::vector<double>> parse_metric_percentiles(std::string_view text) {
  std::vector<double> ps;
  for (const std::string& item : split(text, ",")) {
    ASSIGN_OR_RETURN(double p, parse_number(item, "--metric-percentiles"));
    if (p < 0 || p > 100) {
      return invalid_argument("--metric-percentiles must be within [0, 100], got " + item);
    }
    ps.push_back(p);
  }
  if (ps.empty()) {
    return invalid_argument("--metric-percentiles is empty");
  }
  return ps;
}

Result<double> parse_request_rate(std::string_view text) {
  std::string s(text);
  if (s == "inf" || s == "Inf" || s == "infinity") {
    return std::numeric_limits<double>::infinity();
  }
  ASSIGN_OR_RETURN(double rate, parse_number(s, "--request-rate"));
  if (!(rate > 0)) {
    return invalid_argument("--request-rate must be > 0 or inf, got " + s);
  }
  return rate;
}

Status validate(const BenchServeOptions& o) {
  if (o.backend != "openai" && o.backend != "vllm" && o.backend != "openai-chat") {
    return invalid_argument("--backend must be vllm, openai or openai-chat, got '" + o.backend +
                            "'");
  }
  if (o.endpoint.empty() || o.endpoint.front() != '/') {
    return invalid_argument("--endpoint must be a path such as /v1/completions, got '" +
                            o.endpoint + "'");
  }
  if (!ends_with(o.endpoint, "/completions")) {
    return invalid_argument("--endpoint must be /v1/completions or /v1/chat/completions, got '" +
                            o.endpoint + "'");
  }
  if (o.dataset_name == "random" || o.dataset_name == "random-mm" ||
      o.dataset_name == "prefix_repetition") {
    if (!o.dataset_path.empty()) {
      return invalid_argument("--dataset-name " + o.dataset_name +
                              " makes its own prompts: drop --dataset-path "
                              "(or use --dataset-name sharegpt)");
    }
  } else if (o.dataset_name == "sharegpt") {
    if (o.dataset_path.empty()) {
      return invalid_argument("--dataset-name sharegpt needs --dataset-path FILE.json");
    }
  } else {
    return invalid_argument(
        "--dataset-name must be random, random-mm, prefix_repetition or sharegpt, got '" +
        o.dataset_name + "'");
  }
  if (o.random_num_prefixes != 1 && (o.dataset_name == "sharegpt" || o.random_prefix_len == 0)) {
    return invalid_argument(
        "--random-num-prefixes needs --random-prefix-len > 0 and a random dataset");
  }
  if (o.dataset_name == "random-mm") {
    if (!ends_with(o.endpoint, "/chat/completions")) {
      return invalid_argument(
          "--dataset-name random-mm sends images, which only the chat endpoint takes (as in "
          "vLLM): use --endpoint /v1/chat/completions (the default with random-mm), not '" +
          o.endpoint + "'");
    }
    if (o.random_mm_buckets.empty()) {
      return invalid_argument("--random-mm-bucket-config has no image bucket");
    }
    RETURN_IF_ERROR(mm_items_range(random_mm_options(o)).status());
  }
  if (o.num_prompts <= 0) {
    return invalid_argument("--num-prompts must be > 0");
  }
  if (!(o.request_rate > 0)) {
    return invalid_argument("--request-rate must be > 0 or inf");
  }
  if (!(o.burstiness > 0)) {
    return invalid_argument("--burstiness must be > 0");
  }
  if (o.max_concurrency < 0) {
    return invalid_argument("--max-concurrency must be > 0");
  }
  if (!(o.request_timeout_s > 0)) {
    return invalid_argument("--request-timeout-s must be > 0");
  }
  if (!(o.ready_check_timeout_s >= 0 && o.ready_check_timeout_s < 1e9)) {
    return invalid_argument("--ready-check-timeout-sec must be >= 0, got " +
                            python_float(o.ready_check_timeout_s));
  }
  if (o.num_warmups < 0) {
    return invalid_argument("--num-warmups must be >= 0");
  }
  json extra = json::parse(o.extra_body_json, nullptr, /*allow_exceptions=*/false);
  if (!extra.is_object()) {
    return invalid_argument("--extra-body must be a JSON object, got '" + o.extra_body_json + "'");
  }
  return Status::ok();
}

Result<json> run_bench_serve(const BenchServeOptions& o, FILE* out, FILE* log) {
  RETURN_IF_ERROR(validate(o));
  ServerAddress address;
  if (!o.base_url.empty()) {
    ASSIGN_OR_RETURN(address, parse_base_url(o.base_url));
  } else {
    address.host = o.host;
    address.port = o.port;
  }
  const bool is_chat = o.backend == "openai-chat" || ends_with(o.endpoint, "/chat/completions");
  std::string endpoint = o.endpoint;
  if (o.backend == "openai-chat" && !ends_with(endpoint, "/chat/completions")) {
    endpoint = "/v1/chat/completions";
  }

  if (o.ready_check_timeout_s > 0) {
    RETURN_IF_ERROR(wait_until_ready(address, o.ready_check_timeout_s, out));
  }
  net::http::Headers headers;
  for (const auto& [name, value] : o.headers) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    headers[lower] = value;
  }
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr && *key != '\0') {
    headers.emplace("authorization", std::string("Bearer ") + key);
  }

  std::unique_ptr<PromptTokenizer> local_tokenizer;
  if (!o.tokenizer.empty()) {
    ASSIGN_OR_RETURN(local_tokenizer, open_local_prompt_tokenizer(o.tokenizer));
  }
  std::string model_name = o.served_model_name;
  if (model_name.empty()) {
    std::fprintf(out, "Model not specified, fetching first model from server...\n");
    ASSIGN_OR_RETURN(model_name, first_served_model(address));
    std::fprintf(out, "First model name: %s\n", model_name.c_str());
  }
  std::unique_ptr<PromptTokenizer> tokenizer_owner = std::move(local_tokenizer);
  if (tokenizer_owner == nullptr) {
    ServerTokenizerOptions server;
    server.address = address;
    server.model = model_name;
    server.headers = headers;
    ASSIGN_OR_RETURN(tokenizer_owner, connect_server_tokenizer(server));
    std::fprintf(out, "Tokenizer: the server's (%s)\n", tokenizer_owner->source().c_str());
  }
  const PromptTokenizer& tokenizer = *tokenizer_owner;
  ASSIGN_OR_RETURN(std::vector<SampleRequest> prompts, make_prompts(o, tokenizer));
  const bool has_images = o.dataset_name == "random-mm";
  if (has_images) {
    // Every image up front, each its own random pixels (a repeated image would hit the server's
    // encoder and prefix caches), so the timed loop only sends.
    auto start = std::chrono::steady_clock::now();
    const unsigned num_cores = std::thread::hardware_concurrency();
    RETURN_IF_ERROR(add_random_images(&prompts, random_mm_options(o),
                                      static_cast<int>(std::max(1u, num_cores))));
    int64_t num_images = 0;
    double num_bytes = 0;
    for (const SampleRequest& p : prompts) {
      num_images += static_cast<int64_t>(p.image_urls.size());
      for (const std::string& url : p.image_urls) {
        num_bytes += static_cast<double>(url.size());
      }
    }
    std::fprintf(out, "Generated %lld random images (%.1f MiB of PNG data URLs) in %.2f s\n",
                 static_cast<long long>(num_images), num_bytes / 1048576.0,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  RequestOptions request_options;
  request_options.path = address.path_prefix + endpoint;
  request_options.is_chat = is_chat;
  request_options.model = model_name;
  request_options.ignore_eos = o.ignore_eos || o.dataset_name == "random" ||
                               o.dataset_name == "random-mm" ||
                               o.dataset_name == "prefix_repetition";
  request_options.extra_body_json = o.extra_body_json;
  request_options.extra_headers = headers;
  request_options.timeout_s = o.request_timeout_s;
  const std::string id_prefix = "bench-" + random_uuid().substr(0, 8) + "-";

  if (!o.skip_test_request) {
    std::fprintf(out, "Starting initial single prompt test run...\n");
    std::fflush(out);
    net::http::HttpClient client(address.host, address.port);
    RequestOutput test = send_request(client, prompts[0], request_options, id_prefix + "test");
    if (!test.success) {
      return failed_precondition(
          "Initial test run failed - Please make sure benchmark arguments are correctly "
          "specified. Error: " +
          test.error);
    }
    std::fprintf(out, "Initial test run completed.\n");
  }
  if (o.num_warmups > 0) {
    std::fprintf(out, "Warming up with %d requests...\n", o.num_warmups);
    LoadOptions warm;
    warm.arrival_offsets_s.assign(static_cast<size_t>(o.num_warmups), 0.0);
    warm.max_concurrency = o.max_concurrency;
    std::vector<std::unique_ptr<net::http::HttpClient>> clients;
    for (size_t w = 0; w < num_load_threads(warm); ++w) {
      clients.push_back(std::make_unique<net::http::HttpClient>(address.host, address.port));
    }
    run_load(warm, [&](size_t i, size_t worker) {
      return send_request(*clients[worker], prompts[0], request_options,
                          id_prefix + "warmup-" + std::to_string(i));
    });
    std::fprintf(out, "Warmup run completed.\n");
  }
  std::fprintf(out, "Starting main benchmark run...\n");

  ArrivalOptions arrival;
  arrival.request_rate = o.request_rate;
  arrival.burstiness = o.burstiness;
  arrival.seed = o.seed;
  LoadOptions load;
  ASSIGN_OR_RETURN(load.arrival_offsets_s,
                   arrival_offsets_s(static_cast<int64_t>(prompts.size()), arrival));
  load.max_concurrency = o.max_concurrency;
  std::fprintf(out, "Traffic request rate: %s\n", python_float(o.request_rate).c_str());
  std::fprintf(out, "Burstiness factor: %s (%s)\n", python_float(o.burstiness).c_str(),
               o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::fprintf(out, "Maximum request concurrency: %s\n",
               o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "None");
  size_t num_threads = num_load_threads(load);
  if (o.max_concurrency == 0 && num_threads < prompts.size()) {
    std::fprintf(out,
                 "Note: at most %zu requests are in flight at once (one thread each); "
                 "set --max-concurrency to choose.\n",
                 num_threads);
  }
  std::fflush(out);

  std::vector<std::unique_ptr<net::http::HttpClient>> clients;
  for (size_t w = 0; w < num_threads; ++w) {
    clients.push_back(std::make_unique<net::http::HttpClient>(address.host, address.port));
  }
  LoadProgress progress;
  std::unique_ptr<ProgressBar> bar;
  if (o.show_progress && log != nullptr && ::isatty(::fileno(log)) != 0) {
    bar = std::make_unique<ProgressBar>(progress, static_cast<int64_t>(prompts.size()), log);
  }
  LoadResult result = run_load(
      load,
      [&](size_t i, size_t worker) {
        return send_request(*clients[worker], prompts[i], request_options,
                            id_prefix + std::to_string(i));
      },
      &progress);
  if (bar) {
    bar->stop();
  }

  MetricsOptions metrics_options;
  metrics_options.duration_s = result.duration_s;
  metrics_options.percentiles = o.metric_percentiles;
  metrics_options.goodput = o.goodput;
  BenchmarkMetrics metrics =
      calculate_metrics(result.outputs, metrics_options, [&](const std::string& text) -> int64_t {
        auto ids = tokenizer.encode(text, /*add_special_tokens=*/false);
        return ids.is_ok() ? static_cast<int64_t>(ids->size()) : 0;
      });

  RunInfo info;
  info.date = now_date();
  info.backend = o.backend;
  info.label = o.label;
  info.model_id = model_name;
  info.tokenizer_id = tokenizer.source();
  info.base_url = address.url();
  info.endpoint = endpoint;
  info.dataset_name = o.dataset_name;
  info.num_prompts = o.num_prompts;
  info.request_rate = o.request_rate;
  info.burstiness = o.burstiness;
  info.max_concurrency = o.max_concurrency;
  info.seed = o.seed;
  info.percentile_metrics = o.percentile_metrics;
  info.percentiles = o.metric_percentiles;
  info.goodput = o.goodput;
  info.has_images = has_images;

  std::fputs(format_failures(result.outputs).c_str(), out);
  if (metrics.completed == 0) {
    std::fprintf(out,
                 "All requests failed. This is likely due to a misconfiguration on the "
                 "benchmark arguments.\n");
  }
  std::fputs(format_report(metrics, info, result.duration_s).c_str(), out);
  json j = result_json(metrics, info, result.duration_s, result.outputs, o.save_detailed);

  std::string chart_path = o.chart;
  if (chart_path.empty() && !o.save_result.empty()) {
    chart_path = std::filesystem::path(o.save_result).replace_extension(".svg").string();
  }
  if (!chart_path.empty()) {
    j["chart"] = chart_path;
    RETURN_IF_ERROR(write_file(
        chart_path,
        render_chart_svg(result.outputs, metrics, chart_title(info, metrics, result.duration_s))));
    std::fprintf(out, "Chart saved to %s\n", chart_path.c_str());
  }
  if (!o.save_result.empty()) {
    RETURN_IF_ERROR(
        write_file(o.save_result, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"));
    std::fprintf(out, "Result saved to %s\n", o.save_result.c_str());
  }
  std::fflush(out);
  return j;
}

}  // namespace crescent::bench
