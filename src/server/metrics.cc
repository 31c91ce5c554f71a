#include "server/metrics.h"

namespace crescent::server {
using prometheus::append_header;
using prometheus::format_number;

ServerMetrics::ServerMetrics()
    // vLLM's buckets.
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      itl_({0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
            0.3,   0.4,   0.5,   0.75,  1.0,    2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::observe_finished(const std::string& finish_reason, double ttft_s, double e2e_s,
                                     int num_output_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_by_reason_[finish_reason];
  e2e_.observe(e2e_s);
  if (num_output_tokens > 0) {
    ttft_.observe(ttft_s);
  }
  if (num_output_tokens > 1) {
    tpot_.observe((e2e_s - ttft_s) / (num_output_tokens - 1));
  }
}

void ServerMetrics::observe_inter_token(double gap_s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(gap_s);
}

void ServerMetrics::observe_http_request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_by_status_[status];
}

std::string ServerMetrics::render(const std::string& model_name, const EngineMetrics& engine,
                                  int num_in_flight, bool vllm_names) const {
  std::string out;
  std::string label = "{model_name=\"" + model_name + "\"}";
  prometheus::SampleWriter w(&out, "", label);
  auto gauge = [&](const std::string& name, const char* help, double v) { w.gauge(name, help, v); };
  auto counter = [&](const std::string& name, const char* help, double v) {
    w.counter(name, help, v);
  };
  gauge("crescent_num_requests_running", "Requests the engine is running.", engine.num_running);
  gauge("crescent_num_requests_waiting", "Requests waiting to be scheduled.", engine.num_waiting);
  gauge("crescent_http_requests_in_flight", "Generation requests the server is answering.",
        num_in_flight);
  gauge("crescent_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0 to 1).",
        engine.num_blocks_total > 0
            ? static_cast<double>(engine.num_blocks_used) / engine.num_blocks_total
            : 0.0);
  gauge("crescent_kv_cache_blocks_used", "KV-cache blocks in use.", engine.num_blocks_used);
  // Not "_total": Prometheus keeps that suffix for counters (promtool rejects it on a gauge).
  gauge("crescent_kv_cache_blocks", "KV-cache blocks in the pool.", engine.num_blocks_total);
  gauge("crescent_num_requests_waiting_for_remote_kv",
        "Decode-side requests waiting for a prefill engine to send their KV.",
        engine.num_waiting_for_remote_kv);
  gauge("crescent_kv_cache_blocks_held_for_remote",
        "KV-cache blocks kept for a peer engine (counted in blocks_used too).",
        engine.num_blocks_held_for_remote);
  counter("crescent_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(engine.prefix_cache_queries_tokens));
  counter("crescent_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(engine.prefix_cache_hits_tokens));
  counter("crescent_prompt_tokens_total", "Prompt tokens processed.",
          static_cast<double>(engine.num_prompt_tokens_total));
  counter("crescent_generation_tokens_total", "Tokens generated.",
          static_cast<double>(engine.num_generation_tokens_total));
  counter("crescent_num_preemptions_total", "Requests preempted for lack of KV blocks.",
          static_cast<double>(engine.num_preemptions_total));
  if (engine.encoder_cache_tokens_total > 0) {
    counter("crescent_encoder_images_total", "Images run through the vision encoder.",
            static_cast<double>(engine.num_images_encoded_total));
    counter("crescent_encoder_tokens_total", "Embedding rows the vision encoder produced.",
            static_cast<double>(engine.num_encoder_tokens_total));
    counter("crescent_encoder_seconds_total", "Time spent in the vision encoder.",
            engine.encoder_seconds_total);
    counter("crescent_encoder_cache_hits_total",
            "Images whose embeddings came from the encoder cache.",
            static_cast<double>(engine.encoder_cache_hits_total));
    counter("crescent_encoder_cache_misses_total", "Images the encoder cache did not hold.",
            static_cast<double>(engine.encoder_cache_misses_total));
    counter("crescent_encoder_cache_evictions_total", "Encoder cache entries evicted.",
            static_cast<double>(engine.encoder_cache_evictions_total));
    gauge("crescent_encoder_cache_usage_ratio",
          "Fraction of the encoder cache (embedding rows) in use (0 to 1).",
          static_cast<double>(engine.encoder_cache_tokens_used) /
              static_cast<double>(engine.encoder_cache_tokens_total));
  }

  std::lock_guard<std::mutex> lock(mu_);
  append_header(&out, "crescent_request_success_total", "counter",
                "Finished generation requests by finish reason.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = finished_by_reason_.find(reason);
    out += std::string("crescent_request_success_total{model_name=\"") + model_name +
           "\",finished_reason=\"" + reason + "\"} " +
           std::to_string(it == finished_by_reason_.end() ? 0 : it->second) + "\n";
  }
  append_header(&out, "crescent_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : http_by_status_) {
    out += "crescent_http_responses_total{status=\"" + std::to_string(status) + "\"} " +
           std::to_string(n) + "\n";
  }
  append_header(&out, "crescent_time_to_first_token_seconds", "histogram",
                "Time from arrival to the first output token.");
  ttft_.render("crescent_time_to_first_token_seconds", &out);
  append_header(&out, "crescent_time_per_output_token_seconds", "histogram",
                "Mean time between output tokens, per request.");
  tpot_.render("crescent_time_per_output_token_seconds", &out);
  append_header(&out, "crescent_inter_token_latency_seconds", "histogram",
                "Time between two consecutive token-carrying outputs of a request, as the server "
                "hands them to the client.");
  itl_.render("crescent_inter_token_latency_seconds", &out);
  append_header(&out, "crescent_e2e_request_latency_seconds", "histogram",
                "Time from arrival to the last output token.");
  e2e_.render("crescent_e2e_request_latency_seconds", &out);
  if (vllm_names) {
    render_vllm_names_locked(model_name, engine, &out);
  }
  return out;
}

void ServerMetrics::render_vllm_names_locked(const std::string& model_name,
                                             const EngineMetrics& engine, std::string* out) const {
  // The labels vLLM's V1 engine puts on each (engine: its index; one engine here).
  const std::string labels = "model_name=\"" + model_name + "\",engine=\"0\"";
  prometheus::SampleWriter w(out, "", "{" + labels + "}");
  const double usage = engine.num_blocks_total > 0
                           ? static_cast<double>(engine.num_blocks_used) / engine.num_blocks_total
                           : 0.0;
  w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          engine.num_running);
  w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          engine.num_waiting);
  w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  w.gauge("vllm:gpu_cache_usage_perc",
          "KV-cache usage, under vLLM's older name. 1 means 100 percent usage.", usage);
  w.counter("vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            static_cast<double>(engine.prefix_cache_queries_tokens));
  w.counter("vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            static_cast<double>(engine.prefix_cache_hits_tokens));
  w.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
            static_cast<double>(engine.num_prompt_tokens_total));
  w.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            static_cast<double>(engine.num_generation_tokens_total));
  w.counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.",
            static_cast<double>(engine.num_preemptions_total));
  append_header(out, "vllm:request_success_total", "counter",
                "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = finished_by_reason_.find(reason);
    *out += "vllm:request_success_total{" + labels + ",finished_reason=\"" + reason + "\"} " +
            std::to_string(it == finished_by_reason_.end() ? 0 : it->second) + "\n";
  }
  const struct {
    const char* name;
    const char* help;
    const prometheus::Histogram* histogram;
  } histograms[] = {
      {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &ttft_},
      // vLLM V1 observes this one per step (a deprecated alias of inter_token_latency).
      {"vllm:time_per_output_token_seconds",
       "Histogram of time per output token in seconds (the inter-token latency).", &itl_},
      {"vllm:request_time_per_output_token_seconds",
       "Histogram of time_per_output_token_seconds per request.", &tpot_},
      {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &itl_},
      {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &e2e_},
  };
  for (const auto& h : histograms) {
    append_header(out, h.name, "histogram", h.help);
    h.histogram->render(h.name, labels, out);
  }
}

}  // namespace crescent::server
