#include "bench/disagg/pd_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench/disagg/child_processes.h"
#include "bench/disagg/host_info.h"
#include "bench/disagg/pd_report.h"
#include "bench/disagg/prometheus_scrape.h"
#include "core/clock.h"
#include "core/errno_text.h"
#include "core/ids.h"
#include "kernels/kv_dtype.h"
#include "model/model_files.h"
#include "model/tokenizer.h"
#include "net/http/http_client.h"

namespace crescent::bench {
namespace {

using Json = nlohmann::ordered_json;

struct Endpoints {
  int prefill = -1, decode = -1, proxy = -1;  // child indexes
  int prefill_port = 0, decode_port = 0, proxy_port = 0, bootstrap_port = 0;
};

// The port after `marker` in text ("...http://127.0.0.1:PORT"), 0 if not there yet.
int port_after(const std::string& text, const std::string& marker) {
  size_t pos = text.find(marker);
  if (pos == std::string::npos) {
    return 0;
  }
  size_t colon = text.find(':', text.find("//", pos) + 2);
  if (colon == std::string::npos) {
    return 0;
  }
  return std::atoi(text.c_str() + colon + 1);
}

class PdBench {
 public:
  PdBench(PdBenchOptions o, std::string binary, ChildProcesses* children,
          const InterruptWatcher* watcher)
      : o_(std::move(o)), binary_(std::move(binary)), children_(children), watcher_(watcher) {}

  Status run();

 private:
  Status prepare_prompts();
  Status start_deployment();
  Status wait_for_log(int child, const std::string& marker, Deadline deadline);
  Status wait_healthy(int child, int port, Deadline deadline);
  Result<Scrape> scrape(int port);
  Result<PdRequestFigures> run_request(int index, bool is_warmup);
  Status measure_memcpy(uint64_t num_bytes);
  Status check_interrupted() const {
    return watcher_->is_interrupted() ? cancelled("interrupted") : Status::ok();
  }
  [[nodiscard]] std::string log_tail(int child) const {
    return tail_lines(read_text_file(children_->log_path(child)), 15);
  }

  PdBenchOptions o_;
  std::string binary_;
  ChildProcesses* children_;
  const InterruptWatcher* watcher_;
  std::string served_name_;
  std::vector<std::vector<int32_t>> prompts_;
  Endpoints e_;
  std::unique_ptr<net::http::HttpClient> proxy_client_;
  std::unique_ptr<net::http::HttpClient> prefill_client_;
  std::unique_ptr<net::http::HttpClient> decode_client_;
  PdBenchResult r_;
};

Status PdBench::prepare_prompts() {
  // tokenizer.json beside the model, or a lone GGUF's own tokenizer.
  ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tokenizer, model::open_tokenizer(o_.model));
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    if (!tokenizer->is_special(id) && !tokenizer->id_to_token(id).empty()) {
      allowed.push_back(id);
    }
  }
  if (allowed.size() < 2) {
    return invalid_argument("the tokenizer of " + o_.model + " has no ordinary tokens");
  }
  // Random ids: distinct prompts share no full block, so no request hits a prefix cache.
  std::mt19937_64 rng(o_.seed);
  std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
  prompts_.resize(static_cast<size_t>(o_.num_requests) + 1);
  for (auto& p : prompts_) {
    p.resize(static_cast<size_t>(o_.prompt_len));
    for (int32_t& id : p) {
      id = allowed[pick(rng)];
    }
  }
  return Status::ok();
}

Status PdBench::wait_for_log(int child, const std::string& marker, Deadline deadline) {
  for (;;) {
    RETURN_IF_ERROR(check_interrupted());
    if (read_text_file(children_->log_path(child)).find(marker) != std::string::npos) {
      return Status::ok();
    }
    if (!children_->is_running(child)) {
      return unavailable(children_->log_path(child) + ": the process ended (" +
                         children_->describe_exit(child) + ") before '" + marker +
                         "'; its last lines:\n" + log_tail(child));
    }
    if (deadline.is_expired()) {
      return deadline_exceeded(children_->log_path(child) + ": no '" + marker + "' within " +
                               std::to_string(static_cast<int>(o_.startup_timeout_s)) +
                               " s (--startup-timeout); its last lines:\n" + log_tail(child));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status PdBench::wait_healthy(int child, int port, Deadline deadline) {
  net::http::HttpClient client("127.0.0.1", port);
  std::string last;
  for (;;) {
    RETURN_IF_ERROR(check_interrupted());
    auto r = client.request("GET", "/health", "", {}, Deadline::after_ms(2000));
    if (r.is_ok() && r->status == 200) {
      return Status::ok();
    }
    last = r.is_ok() ? std::to_string(r->status) + " " + r->body : r.status().to_string();
    if (!children_->is_running(child)) {
      return unavailable(children_->log_path(child) + ": the process ended (" +
                         children_->describe_exit(child) + "); its last lines:\n" +
                         log_tail(child));
    }
    if (deadline.is_expired()) {
      return deadline_exceeded("http://127.0.0.1:" + std::to_string(port) +
                               "/health is not 200 in time (last: " + last + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status PdBench::start_deployment() {
  Deadline deadline = Deadline::after(
      std::chrono::milliseconds(static_cast<int64_t>(std::llround(o_.startup_timeout_s * 1000))));
  char timeout[32];
  std::snprintf(timeout, sizeof(timeout), "%g", o_.kv_transfer_timeout_s);
  auto serve_args = [&](const std::string& role, int threads) {
    std::vector<std::string> a = {"serve",
                                  "--model",
                                  o_.model,
                                  "--served-model-name",
                                  served_name_,
                                  "--role",
                                  role,
                                  "--host",
                                  "127.0.0.1",
                                  "--port",
                                  "0",
                                  "--threads",
                                  std::to_string(threads),
                                  "--kv-transport",
                                  o_.kv_transport,
                                  "--kv-transfer-timeout",
                                  timeout,
                                  "--kv-cache-mb",
                                  std::to_string(o_.kv_cache_mb),
                                  "--kv-cache-dtype",
                                  o_.kv_cache_dtype,
                                  "--drain-timeout-s",
                                  "1"};
    if (role == "prefill") {
      a.insert(a.end(), {"--bootstrap-port", "0"});
    }
    return a;
  };
  // Both servers load the model at the same time.
  ASSIGN_OR_RETURN(e_.prefill, children_->start("prefill", binary_,
                                                serve_args("prefill", r_.num_prefill_threads),
                                                o_.log_dir + "/prefill.log"));
  ASSIGN_OR_RETURN(e_.decode,
                   children_->start("decode", binary_, serve_args("decode", r_.num_decode_threads),
                                    o_.log_dir + "/decode.log"));
  RETURN_IF_ERROR(wait_for_log(e_.prefill, "crescent serve: ready", deadline));
  RETURN_IF_ERROR(wait_for_log(e_.decode, "crescent serve: ready", deadline));
  std::string p_log = read_text_file(children_->log_path(e_.prefill));
  std::string d_log = read_text_file(children_->log_path(e_.decode));
  e_.prefill_port = port_after(p_log, "listening on http://");
  e_.bootstrap_port = port_after(p_log, "crescent serve: bootstrap http://");
  e_.decode_port = port_after(d_log, "listening on http://");
  if (e_.prefill_port <= 0 || e_.bootstrap_port <= 0 || e_.decode_port <= 0) {
    return internal_error("cannot read the servers' ports from " + o_.log_dir +
                          "/{prefill,decode}.log");
  }
  RETURN_IF_ERROR(wait_healthy(e_.prefill, e_.prefill_port, deadline));
  RETURN_IF_ERROR(wait_healthy(e_.decode, e_.decode_port, deadline));

  std::string p_url = "http://127.0.0.1:" + std::to_string(e_.prefill_port);
  std::string d_url = "http://127.0.0.1:" + std::to_string(e_.decode_port);
  ASSIGN_OR_RETURN(
      e_.proxy, children_->start("proxy", binary_,
                                 {"proxy", "--host", "127.0.0.1", "--port", "0", "--prefill", p_url,
                                  std::to_string(e_.bootstrap_port), "--decode", d_url,
                                  "--io-threads", "1", "--drain-timeout", "1"},
                                 o_.log_dir + "/proxy.log"));
  RETURN_IF_ERROR(wait_for_log(e_.proxy, "listening on http://", deadline));
  e_.proxy_port = port_after(read_text_file(children_->log_path(e_.proxy)), "listening on http://");
  if (e_.proxy_port <= 0) {
    return internal_error("cannot read the proxy's port from " + o_.log_dir + "/proxy.log");
  }
  // 503 until the proxy has read the prefill's engine id from the bootstrap server.
  RETURN_IF_ERROR(wait_healthy(e_.proxy, e_.proxy_port, deadline));
  proxy_client_ = std::make_unique<net::http::HttpClient>("127.0.0.1", e_.proxy_port);
  prefill_client_ = std::make_unique<net::http::HttpClient>("127.0.0.1", e_.prefill_port);
  decode_client_ = std::make_unique<net::http::HttpClient>("127.0.0.1", e_.decode_port);
  return Status::ok();
}

Result<Scrape> PdBench::scrape(int port) {
  net::http::HttpClient& client = port == e_.prefill_port ? *prefill_client_ : *decode_client_;
  ASSIGN_OR_RETURN(net::http::Response r,
                   client.request("GET", "/metrics", "", {}, Deadline::after_ms(10'000)));
  if (r.status != 200) {
    return unavailable("GET http://127.0.0.1:" + std::to_string(port) +
                       "/metrics: " + std::to_string(r.status));
  }
  return parse_prometheus_text(r.body);
}

Result<PdRequestFigures> PdBench::run_request(int index, bool is_warmup) {
  PdRequestFigures f;
  f.is_warmup = is_warmup;
  ASSIGN_OR_RETURN(Scrape p0, scrape(e_.prefill_port));
  ASSIGN_OR_RETURN(Scrape d0, scrape(e_.decode_port));
  int64_t p_faults0 = minor_page_faults(children_->pid(e_.prefill));
  int64_t d_faults0 = minor_page_faults(children_->pid(e_.decode));

  Json body;
  body["model"] = served_name_;
  body["prompt"] = prompts_[static_cast<size_t>(index)];
  body["max_tokens"] = o_.output_len;
  body["temperature"] = 0;
  body["ignore_eos"] = true;
  body["stream"] = true;
  std::string request_id = "pdbench-" + std::to_string(index) + "-" + random_uuid().substr(0, 8);
  net::http::Headers headers = {{"content-type", "application/json"}, {"x-request-id", request_id}};
  net::http::SseParser parser;
  std::string raw_start;  // the body's start, for error messages
  std::string error;
  bool is_done = false;
  TimePoint first_token{};
  TimePoint t0 = Clock::now();
  auto on_event = [&](std::string_view data) {
    if (data == "[DONE]") {
      is_done = true;
      return;
    }
    Json event = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (event.is_discarded()) {
      error = "not JSON: " + std::string(data.substr(0, 200));
    } else if (event.contains("error")) {
      error = event["error"].dump();
    } else if (event.contains("choices") && !event["choices"].empty()) {
      if (f.num_chunks++ == 0) {
        first_token = Clock::now();
      }
    }
  };
  auto response = proxy_client_->stream(
      "POST", "/v1/completions", body.dump(), headers,
      [&](std::string_view piece) {
        if (raw_start.size() < 2048) {
          raw_start.append(piece.substr(0, 2048 - raw_start.size()));
        }
        parser.feed(piece, on_event);
        return !watcher_->is_interrupted();
      },
      Deadline::after(std::chrono::milliseconds(
          static_cast<int64_t>(std::llround(o_.request_timeout_s * 1000)))));
  f.e2e_s = seconds_since(t0);
  RETURN_IF_ERROR(check_interrupted());
  std::string what = "request " + request_id + " through the proxy";
  if (!response.is_ok()) {
    return response.status().with_context(what);
  }
  if (response->status != 200) {
    return unavailable(what + ": HTTP " + std::to_string(response->status) + ": " + raw_start);
  }
  if (!error.empty()) {
    return unavailable(what + ": error event " + error);
  }
  if (!is_done || f.num_chunks == 0) {
    return data_loss(what + ": the stream ended without " +
                     (f.num_chunks == 0 ? std::string("a token") : std::string("[DONE]")));
  }
  f.client_ttft_s = std::chrono::duration<double>(first_token - t0).count();

  // The servers observe their histograms before they answer, but P's write histogram is
  // observed just after DONE is sent: poll until every family moved by one.
  Scrape p1, d1;
  Deadline settle = Deadline::after_ms(10'000);
  auto delta = [](const Scrape& a, const Scrape& b, const std::string& name,
                  const std::string& label = "") {
    return scrape_value(b, name, label) - scrape_value(a, name, label);
  };
  const std::string kv = "crescent_kv_transfer_";
  const std::string ttft = "crescent_time_to_first_token_seconds";
  for (;;) {
    ASSIGN_OR_RETURN(p1, scrape(e_.prefill_port));
    ASSIGN_OR_RETURN(d1, scrape(e_.decode_port));
    bool has_settled = delta(d0, d1, ttft + "_count") == 1 &&
                       delta(d0, d1, kv + "fetch_seconds_count") == 1 &&
                       delta(p0, p1, ttft + "_count") == 1 &&
                       delta(p0, p1, kv + "write_seconds_count", "role=\"prefill\"") == 1;
    if (has_settled) {
      break;
    }
    if (settle.is_expired()) {
      return data_loss(
          what + ": the servers' /metrics did not show exactly one new request " +
          "(decode TTFT count +" + std::to_string(delta(d0, d1, ttft + "_count")) +
          ", decode fetch count +" + std::to_string(delta(d0, d1, kv + "fetch_seconds_count")) +
          ", prefill write count +" +
          std::to_string(delta(p0, p1, kv + "write_seconds_count", "role=\"prefill\"")) +
          "): is something else using these servers?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  f.p_minor_faults = minor_page_faults(children_->pid(e_.prefill)) - p_faults0;
  f.d_minor_faults = minor_page_faults(children_->pid(e_.decode)) - d_faults0;
  f.d_ttft_s = delta(d0, d1, ttft + "_sum");
  f.proxy_s = f.client_ttft_s - f.d_ttft_s;
  f.bootstrap_s = delta(d0, d1, kv + "bootstrap_seconds_sum");
  f.wait_s = delta(d0, d1, kv + "wait_seconds_sum");
  f.transfer_s = delta(d0, d1, kv + "transfer_seconds_sum");
  f.fetch_s = delta(d0, d1, kv + "fetch_seconds_sum");
  f.recompute_s = f.d_ttft_s - f.fetch_s;
  f.other_s = f.fetch_s - f.bootstrap_s - f.wait_s - f.transfer_s;
  f.d_tpot_s = delta(d0, d1, "crescent_time_per_output_token_seconds_sum");
  f.p_ttft_s = delta(p0, p1, ttft + "_sum");
  f.p_write_s = delta(p0, p1, kv + "write_seconds_sum", "role=\"prefill\"");
  f.num_bytes = delta(d0, d1, kv + "bytes_total", "role=\"decode\"");
  f.d_prefix_hit_tokens = delta(d0, d1, "crescent_prefix_cache_hits_total");
  f.p_prefix_hit_tokens = delta(p0, p1, "crescent_prefix_cache_hits_total");
  double p_bytes = delta(p0, p1, kv + "bytes_total", "role=\"prefill\"");
  if (f.num_bytes <= 0 || p_bytes != f.num_bytes) {
    return data_loss(what + ": the decode server received " + std::to_string(f.num_bytes) +
                     " KV bytes, the prefill server wrote " + std::to_string(p_bytes));
  }
  return f;
}

Status PdBench::measure_memcpy(uint64_t num_bytes) {
  for (int rep = 0; rep < o_.memcpy_reps; ++rep) {
    for (CopyKind kind : kCopyKinds) {
      ASSIGN_OR_RETURN(double s, time_one_copy(num_bytes, kind));
      r_.copy_s[kind].push_back(s);
    }
  }
  return Status::ok();
}

Status PdBench::run() {
  std::string name = std::filesystem::path(o_.model).filename().string();
  if (name.empty()) {
    name = std::filesystem::path(o_.model).parent_path().filename().string();
  }
  served_name_ = name.empty() ? "model" : name;
  const int cores = num_usable_cores();
  r_.num_cores = cores;
  r_.num_prefill_threads = o_.prefill_threads > 0 ? o_.prefill_threads : std::max(1, cores / 2);
  r_.num_decode_threads =
      o_.decode_threads > 0 ? o_.decode_threads : std::max(1, cores - r_.num_prefill_threads);
  r_.load_at_start = load_average();
  RETURN_IF_ERROR(prepare_prompts());
  std::printf(
      "bench disagg: %s, kv-transport %s, %d cores (compute threads: prefill %d, decode %d), "
      "load average %s\n",
      served_name_.c_str(), o_.kv_transport.c_str(), cores, r_.num_prefill_threads,
      r_.num_decode_threads, r_.load_at_start.c_str());
  std::printf("bench disagg: starting prefill, decode and proxy; logs in %s\n", o_.log_dir.c_str());
  std::fflush(stdout);
  TimePoint t_start = Clock::now();
  RETURN_IF_ERROR(start_deployment());
  std::printf(
      "bench disagg: ready after %.1f s (prefill :%d, bootstrap :%d, decode :%d, "
      "proxy :%d)\n",
      seconds_since(t_start), e_.prefill_port, e_.bootstrap_port, e_.decode_port, e_.proxy_port);
  std::fflush(stdout);

  for (int i = 0; i <= o_.num_requests; ++i) {
    bool is_warmup = i == 0;
    ASSIGN_OR_RETURN(PdRequestFigures f, run_request(i, is_warmup));
    if (!is_warmup && static_cast<uint64_t>(f.num_bytes) != r_.num_bytes) {
      return data_loss("request " + std::to_string(i) + " moved " +
                       std::to_string(static_cast<uint64_t>(f.num_bytes)) +
                       " KV bytes, the warm-up " + std::to_string(r_.num_bytes));
    }
    r_.num_bytes = static_cast<uint64_t>(f.num_bytes);
    std::printf("  %-8s TTFT %9.1f ms  transfer %7.2f ms  (%.1f MiB)\n",
                pd_request_label(is_warmup, static_cast<int>(i)).c_str(), f.client_ttft_s * 1e3,
                f.transfer_s * 1e3, f.num_bytes / (1 << 20));
    std::fflush(stdout);
    r_.figures.push_back(f);
    // The baseline runs between requests, under the same machine load as the transfers.
    if (!is_warmup) {
      RETURN_IF_ERROR(measure_memcpy(r_.num_bytes));
    }
    RETURN_IF_ERROR(check_interrupted());
  }
  r_.load_at_end = load_average();
  print_pd_report(o_, r_, stdout);
  if (!o_.json_path.empty()) {
    std::ofstream out(o_.json_path);
    out << pd_report_json(o_, r_).dump(2) << "\n";
    out.close();
    if (!out) {
      return internal_error("cannot write " + o_.json_path);
    }
    std::printf("bench disagg: wrote %s\n", o_.json_path.c_str());
  }
  return Status::ok();
}

}  // namespace

Status validate_pd_bench_options(PdBenchOptions& o) {
  if (o.model.empty()) {
    return invalid_argument("--model DIR is required");
  }
  if (!std::filesystem::exists(o.model)) {
    return invalid_argument("--model " + o.model + " does not exist");
  }
  if (o.kv_transport != "shm" && o.kv_transport != "tcp" && o.kv_transport != "ucx") {
    return invalid_argument("--kv-transport must be shm, tcp or ucx, got '" + o.kv_transport + "'");
  }
  if (o.num_requests < 1 || o.num_requests > 10'000) {
    return invalid_argument("--num-requests must be 1..10000");
  }
  if (o.prompt_len < 1 || o.prompt_len > 1'000'000) {
    return invalid_argument("--prompt-len must be 1..1000000");
  }
  if (o.output_len < 1 || o.output_len > 100'000) {
    return invalid_argument("--output-len must be 1..100000");
  }
  if (o.prefill_threads < 0 || o.decode_threads < 0) {
    return invalid_argument("--prefill-threads and --decode-threads must be >= 0 (0: auto)");
  }
  if (o.kv_cache_mb < 1) {
    return invalid_argument("--kv-cache-mb must be >= 1");
  }
  RETURN_IF_ERROR(kernels::parse_kv_dtype(o.kv_cache_dtype).status());
  if (!(o.kv_transfer_timeout_s > 0) || !(o.request_timeout_s > 0) || !(o.startup_timeout_s > 0)) {
    return invalid_argument("timeouts must be > 0 seconds");
  }
  if (o.memcpy_reps < 1 || o.memcpy_reps > 1000) {
    return invalid_argument("--memcpy-reps must be 1..1000");
  }
  if (!(o.target_ratio > 0)) {
    return invalid_argument("--target-ratio must be > 0");
  }
  o.model = std::filesystem::absolute(o.model).lexically_normal().string();
  while (o.model.size() > 1 && o.model.back() == '/') {
    o.model.pop_back();
  }
  if (o.log_dir.empty()) {
    char tmpl[] = "/tmp/crescent-bench-disagg-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      return internal_error("mkdtemp: " + errno_text(errno));
    }
    o.log_dir = tmpl;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec) {
      return invalid_argument("--log-dir " + o.log_dir + ": " + ec.message());
    }
  }
  return Status::ok();
}

PdBenchOutcome run_pd_bench(const PdBenchOptions& o, const std::string& binary) {
  ChildProcesses children;
  PdBenchOutcome outcome;
  {
    InterruptWatcher watcher(&children);
    PdBench bench(o, binary, &children, &watcher);
    outcome.status = bench.run();
    outcome.is_interrupted = watcher.is_interrupted();
    // A server in the middle of a long prefill step stops only after it: do not wait for that
    // when the user asked to stop.
    children.stop_all(outcome.is_interrupted ? std::chrono::seconds(2) : std::chrono::seconds(10));
  }
  return outcome;
}

}  // namespace crescent::bench
