// `crescent bench serve`: the online serving benchmark with `vllm bench serve`'s flags. This
// file only maps flags to bench::BenchServeOptions; src/bench does the work.

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "bench/bench_serve.h"
#include "bench/report.h"

namespace crescent::apps {
namespace {

// vLLM's argparse takes several values after --goodput and --header, and --save-result alone
// as a switch; FlagParser takes one value per flag. Joins the values into one
// (space-separated) and gives a bare --save-result an empty value.
std::vector<std::string> vllm_style_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  auto is_flag = [](const std::string& a) { return a.rfind("--", 0) == 0; };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--goodput" || a == "--header") {
      std::string joined;
      while (i + 1 < args.size() && !is_flag(args[i + 1])) {
        joined += (joined.empty() ? "" : " ") + args[++i];
      }
      out.push_back(a + "=" + joined);
    } else if (a == "--save-result" && (i + 1 >= args.size() || is_flag(args[i + 1]))) {
      out.push_back("--save-result=");
    } else {
      out.push_back(a);
    }
  }
  return out;
}

Result<double> parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) {
    return invalid_argument("--" + flag + " expects a number, got '" + text + "'");
  }
  return v;
}

// vLLM's default result file name: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json.
std::string default_result_name(const bench::BenchServeOptions& o, const std::string& model) {
  std::string base = std::filesystem::path(model).filename().string();
  if (base.empty()) {
    base = "model";
  }
  std::string concurrency =
      o.max_concurrency > 0 ? "-concurrency" + std::to_string(o.max_concurrency) : "";
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &tm);
  return (o.label.empty() ? o.backend : o.label) + "-" + bench::python_float(o.request_rate) +
         "qps" + concurrency + "-" + base + "-" + date + ".json";
}

Status fill_options(const FlagParser& flags, const std::string& request_rate,
                    const std::string& goodput, const std::string& percentile_metrics,
                    const std::string& metric_percentiles, const std::string& headers,
                    const std::string& temperature, const std::string& top_p,
                    const std::string& top_k, const std::string& mm_limit,
                    const std::string& mm_buckets, bench::BenchServeOptions* o) {
  ASSIGN_OR_RETURN(o->request_rate, bench::parse_request_rate(request_rate));
  if (!mm_limit.empty()) {
    ASSIGN_OR_RETURN(o->random_mm_image_limit, bench::parse_mm_limit_per_prompt(mm_limit));
  }
  if (!mm_buckets.empty()) {
    ASSIGN_OR_RETURN(o->random_mm_buckets, bench::parse_mm_bucket_config(mm_buckets));
  }
  // Images go only to the chat endpoint: random-mm picks it unless --endpoint says otherwise
  // (validate() then refuses a completions endpoint).
  if (o->dataset_name == "random-mm" && !flags.was_set("endpoint")) {
    o->endpoint = "/v1/chat/completions";
  }
  if (!goodput.empty() || flags.was_set("goodput")) {
    ASSIGN_OR_RETURN(o->goodput, bench::parse_goodput(goodput));
  }
  ASSIGN_OR_RETURN(o->percentile_metrics, bench::parse_percentile_metrics(percentile_metrics));
  ASSIGN_OR_RETURN(o->metric_percentiles, bench::parse_metric_percentiles(metric_percentiles));
  for (size_t start = 0; start < headers.size();) {
    size_t end = headers.find(' ', start);
    std::string item = headers.substr(start, end == std::string::npos ? end : end - start);
    start = end == std::string::npos ? headers.size() : end + 1;
    if (item.empty()) {
      continue;
    }
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return invalid_argument("--header expects KEY=VALUE, got '" + item + "'");
    }
    o->headers.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  nlohmann::json extra = nlohmann::json::parse(o->extra_body_json, nullptr, false);
  if (!extra.is_object()) {
    return invalid_argument("--extra-body must be a JSON object, got '" + o->extra_body_json + "'");
  }
  if (!temperature.empty()) {
    ASSIGN_OR_RETURN(double v, parse_double("temperature", temperature));
    extra["temperature"] = v;
  }
  if (!top_p.empty()) {
    ASSIGN_OR_RETURN(double v, parse_double("top-p", top_p));
    extra["top_p"] = v;
  }
  if (!top_k.empty()) {
    ASSIGN_OR_RETURN(double v, parse_double("top-k", top_k));
    extra["top_k"] = static_cast<int64_t>(v);
  }
  o->extra_body_json = extra.dump();
  return Status::ok();
}

// A --model value that names something on this machine: an existing path, or one written as a
// path ("/x", "./x", "../x", "~/x") so that a typo is reported as a missing file rather than
// sent to the server as a model name. "Qwen/Qwen2.5-0.5B-Instruct" is a name unless such a
// directory exists here.
bool is_local_path(const std::string& model) {
  if (model.empty()) {
    return false;
  }
  if (model[0] == '/' || model[0] == '~' || model.rfind("./", 0) == 0 ||
      model.rfind("../", 0) == 0) {
    return true;
  }
  std::error_code ec;
  return std::filesystem::exists(model, ec);
}

int run_bench_serve(const std::vector<std::string>& raw_args) {
  bench::BenchServeOptions o;
  std::string model, tokenizer;
  std::string request_rate = "inf";
  std::string goodput, percentile_metrics = "ttft,tpot,itl,e2el", metric_percentiles = "99";
  std::string headers, temperature, top_p, top_k;
  std::string tokenizer_mode = "auto";
  bool trust_remote_code = false;
  std::string result_dir, result_filename;
  std::string mm_limit, mm_buckets;
  int64_t input_len = -1, output_len = -1;
  bool disable_tqdm = false;
  int64_t seed = 0;
  FlagParser flags(
      "crescent bench serve [--model NAME|DIR] [--tokenizer DIR|FILE] "
      "[--base-url URL | --host H --port P] "
      "[--endpoint /v1/completions|/v1/chat/completions] "
      "--dataset-name random|random-mm|prefix_repetition|sharegpt "
      "[--dataset-path FILE] [--random-input-len N] [--random-output-len N] "
      "[--random-range-ratio R] [--random-prefix-len N] [--random-num-prefixes N] "
      "[--random-mm-base-items-per-request N] "
      "[--random-mm-num-mm-items-range-ratio R] [--random-mm-limit-mm-per-prompt JSON] "
      "[--random-mm-bucket-config DICT] [--num-prompts N] [--request-rate R|inf] "
      "[--burstiness B] [--max-concurrency N] [--seed S] [--ignore-eos] "
      "[--goodput ttft:MS tpot:MS e2el:MS itl:MS] [--save-result FILE.json]",
      "Benchmarks an OpenAI-compatible server the way `vllm bench serve` does, with its flag\n"
      "names and meanings: requests arrive as a Poisson process at --request-rate (gamma gaps\n"
      "when --burstiness != 1), each streamed; the report gives successful and failed requests,\n"
      "throughputs, and mean/median/percentiles of TTFT, TPOT, ITL and end-to-end latency, and\n"
      "goodput under the --goodput SLOs. --save-result writes the figures as JSON and an SVG\n"
      "chart beside it. Prompts are made and counted with the served model's tokenizer:\n"
      "--tokenizer, else --model when it is a local directory or file (tokenizer.json, .gguf),\n"
      "else the server's own through its /tokenize and /detokenize endpoints (vLLM's or\n"
      "llama.cpp server's), so that no local copy of the model is needed. The request's\n"
      "\"model\" is --served-model-name, else --model when it is a name, else the server's\n"
      "first model. --dataset-name random-mm adds random-pixel PNG images to the random prompts\n"
      "(chat endpoint only), as vLLM's random multimodal dataset. A progress bar goes to stderr\n"
      "when it is a terminal.");
  flags.add("base-url", &o.base_url, "server base URL, e.g. http://127.0.0.1:8000");
  flags.add("host", &o.host, "server host when --base-url is not given");
  flags.add("port", &o.port, "server port when --base-url is not given");
  flags.add("endpoint", &o.endpoint, "API endpoint: /v1/completions or /v1/chat/completions");
  flags.add("backend", &o.backend,
            "vllm, openai (completions) or openai-chat (chat completions endpoint)");
  flags.add("label", &o.label, "label of the result (default: the backend)");
  flags.add("model", &model,
            "the served model: a local directory or file whose tokenizer makes the prompts, or "
            "its name on the server (then the server tokenizes)");
  flags.add("tokenizer", &tokenizer,
            "tokenizer directory, tokenizer.json or .gguf (default: --model when it is a local "
            "path, else the server's /tokenize)");
  flags.add("tokenizer-mode", &tokenizer_mode,
            "vLLM's; only auto (the tokenizer.json or GGUF tokenizer, or the server's)");
  flags.add("trust-remote-code", &trust_remote_code,
            "accepted for vLLM's command lines; no effect: crescent reads tokenizers as data "
            "and runs no code from a checkpoint");
  flags.add("served-model-name", &o.served_model_name,
            "the \"model\" field of requests (default: the first model of GET /v1/models)");
  flags.add("dataset-name", &o.dataset_name,
            "random, random-mm (random prompts + images), prefix_repetition (shared prefixes "
            "+ random suffixes) or sharegpt");
  flags.add("dataset-path", &o.dataset_path, "ShareGPT JSON file (--dataset-name sharegpt)");
  flags.add("random-input-len", &o.random_input_len, "prompt tokens per request (random)");
  flags.add("random-output-len", &o.random_output_len, "output tokens per request (random)");
  flags.add("random-range-ratio", &o.random_range_ratio,
            "lengths uniform in [len*(1-R), len*(1+R)], R in [0, 1)");
  flags.add("random-prefix-len", &o.random_prefix_len,
            "random tokens shared by every prompt, before its own");
  flags.add("random-num-prefixes", &o.random_num_prefixes,
            "crescent: N different --random-prefix-len prefixes, each prompt starting with one "
            "picked at random (a prefix-repetition workload, as vLLM's prefix_repetition)");
  flags.add("random-mm-base-items-per-request", &o.random_mm_base_items_per_request,
            "random-mm: base number of images per request");
  flags.add(
      "random-mm-num-mm-items-range-ratio", &o.random_mm_num_mm_items_range_ratio,
      "random-mm: images per request uniform in [floor(n*(1-R)), ceil(n*(1+R))], R in [0, 1]");
  flags.add("random-mm-limit-mm-per-prompt", &mm_limit,
            "random-mm: most images per request, as JSON '{\"image\": N}' (default 255)");
  flags.add("random-mm-bucket-config", &mm_buckets,
            "random-mm: image sizes and their probabilities, vLLM's Python dict of "
            "(height, width, num_frames) keys (num_frames 1; default "
            "'{(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}')");
  flags.add("prefix-repetition-prefix-len", &o.prefix_repetition.prefix_len,
            "prefix_repetition: tokens of each shared prefix");
  flags.add("prefix-repetition-suffix-len", &o.prefix_repetition.suffix_len,
            "prefix_repetition: random tokens after the prefix, per request");
  flags.add("prefix-repetition-num-prefixes", &o.prefix_repetition.num_prefixes,
            "prefix_repetition: distinct prefixes, each with --num-prompts / N requests");
  flags.add("prefix-repetition-output-len", &o.prefix_repetition.output_len,
            "prefix_repetition: output tokens per request");
  flags.add("sharegpt-output-len", &o.sharegpt_output_len,
            "output tokens per ShareGPT request (-1: the dataset answer's length)");
  flags.add("input-len", &input_len, "general input length: sets --random-input-len");
  flags.add("output-len", &output_len,
            "general output length: sets --random-output-len and --sharegpt-output-len");
  flags.add("num-prompts", &o.num_prompts, "number of requests");
  flags.add("request-rate", &request_rate, "requests per second, or inf (all at once)");
  flags.add("burstiness", &o.burstiness,
            "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even");
  flags.add("max-concurrency", &o.max_concurrency,
            "most requests in flight at once (0: no limit but 1024 threads)");
  flags.add("seed", &seed, "random seed for prompts and arrivals");
  flags.add("ignore-eos", &o.ignore_eos,
            "send ignore_eos (always on for the random dataset, as vLLM does)");
  flags.add("goodput", &goodput,
            "SLOs as KEY:MS pairs (ttft, tpot, e2el; itl: a request's longest gap between two "
            "chunks, crescent's own), e.g. ttft:500 tpot:50");
  flags.add("percentile-metrics", &percentile_metrics,
            "metrics whose percentiles are reported: ttft,tpot,itl,e2el");
  flags.add("metric-percentiles", &metric_percentiles, "percentiles to report, e.g. 50,90,99");
  flags.add("save-result", &o.save_result,
            "write the JSON result to FILE (bare --save-result: vLLM's default name); an SVG "
            "chart goes beside it");
  flags.add("result-dir", &result_dir, "directory for the result file");
  flags.add("result-filename", &result_filename, "name of the result file");
  flags.add("save-detailed", &o.save_detailed,
            "also save per-request lists (ttfts, itls, latencies, texts, errors)");
  flags.add("chart", &o.chart, "write the SVG chart here (default: the result file with .svg)");
  flags.add("progress", &o.show_progress, "progress bar on stderr when it is a terminal");
  flags.add("disable-tqdm", &disable_tqdm, "no progress bar (vLLM's name for --no-progress)");
  flags.add("temperature", &temperature, "sampling temperature (default: the server's)");
  flags.add("top-p", &top_p, "top-p sampling parameter");
  flags.add("top-k", &top_k, "top-k sampling parameter");
  flags.add("extra-body", &o.extra_body_json, "JSON object merged into every request body");
  flags.add("header", &headers, "extra request headers as KEY=VALUE pairs");
  flags.add("num-warmups", &o.num_warmups, "warm-up requests before the run (not measured)");
  flags.add("request-timeout-s", &o.request_timeout_s, "deadline of each request");
  flags.add("ready-check-timeout-sec", &o.ready_check_timeout_s,
            "wait up to this long for the server's GET /v1/models to answer 200 before starting "
            "(a server still loading); 0: ask once (vLLM's default is 600)");
  if (int code = flags.parse_or_exit_code(vllm_style_args(raw_args)); code >= 0) {
    return code;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "error: unexpected argument '%s' (see --help)\n",
                 flags.positional()[0].c_str());
    return 2;
  }
  if (tokenizer_mode != "auto") {
    std::fprintf(stderr,
                 "error: --tokenizer-mode %s is not supported: crescent reads tokenizer.json or "
                 "a GGUF's tokenizer, or asks the server (auto)\n",
                 tokenizer_mode.c_str());
    return 2;
  }
  if (!tokenizer.empty()) {
    o.tokenizer = tokenizer;
  } else if (is_local_path(model)) {
    o.tokenizer = model;
  } else if (!model.empty() && o.served_model_name.empty()) {
    o.served_model_name = model;  // vLLM's meaning: the model's name, sent in each request
  }
  o.seed = static_cast<uint64_t>(seed);
  o.show_progress = o.show_progress && !disable_tqdm;
  if (input_len >= 0) {
    o.random_input_len = input_len;
  }
  if (output_len >= 0) {
    o.random_output_len = output_len;
    o.sharegpt_output_len = output_len;
  }
  Status s = fill_options(flags, request_rate, goodput, percentile_metrics, metric_percentiles,
                          headers, temperature, top_p, top_k, mm_limit, mm_buckets, &o);
  if (s.is_ok()) {
    s = bench::validate(o);
  }
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  bool wants_result = flags.was_set("save-result") || !result_filename.empty();
  if (wants_result && o.save_result.empty()) {
    o.save_result =
        result_filename.empty()
            ? default_result_name(o, o.served_model_name.empty() ? model : o.served_model_name)
            : result_filename;
  }
  if (wants_result && !result_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(result_dir, ec);
    o.save_result = (std::filesystem::path(result_dir) / o.save_result).string();
  }
  auto result = bench::run_bench_serve(o, stdout, stderr);
  if (!result.is_ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", result.status().message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_serve, "bench serve",
                          "online serving benchmark (vllm bench serve's flags and report)",
                          run_bench_serve)

}  // namespace crescent::apps
