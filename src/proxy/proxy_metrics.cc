#include "proxy/proxy_metrics.h"

namespace crescent::proxy {
namespace {

const char* endpoint_label(size_t i) {
  static const char* const kNames[] = {"completions", "chat_completions", "models", "tokenize",
                                       "detokenize"};
  return kNames[i];
}

const char* outcome_label(size_t i) {
  static const char* const kNames[] = {
      "ok",           "bad_request", "not_ready",           "prefill_error",
      "decode_error", "timeout",     "client_disconnected", "encoder_error"};
  return kNames[i];
}

}  // namespace

ProxyMetrics::ProxyMetrics()
    : time_to_first_byte_(prometheus::latency_buckets_seconds()),
      prefill_(prometheus::latency_buckets_seconds()),
      encode_(prometheus::latency_buckets_seconds()) {}

void ProxyMetrics::set_encoders(std::vector<std::string> urls) {
  std::lock_guard<std::mutex> lock(mu_);
  encoder_requests_.assign(urls.size(), 0);
  encoder_failures_.assign(urls.size(), 0);
  encoder_urls_ = std::move(urls);
}

void ProxyMetrics::count_encoder_request(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  ++encoder_requests_.at(static_cast<size_t>(index));
}

void ProxyMetrics::count_encoder_failure(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  ++encoder_failures_.at(static_cast<size_t>(index));
}

void ProxyMetrics::count_encoder_affinity() {
  std::lock_guard<std::mutex> lock(mu_);
  ++encoder_affinity_;
}

void ProxyMetrics::count_router_decision(const std::string& router, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++router_decisions_[{router, reason}];
}

void ProxyMetrics::count_router_blocks(int matched, int prompt_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  router_matched_blocks_ += static_cast<uint64_t>(matched);
  router_prompt_blocks_ += static_cast<uint64_t>(prompt_blocks);
}

void ProxyMetrics::observe_encode(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  encode_.observe(seconds);
}

void ProxyMetrics::count_request(ApiEndpoint endpoint, Outcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[static_cast<size_t>(endpoint)][static_cast<size_t>(outcome)];
}

void ProxyMetrics::count_upstream_error(UpstreamSide side) {
  std::lock_guard<std::mutex> lock(mu_);
  ++upstream_errors_[static_cast<size_t>(side)];
}

void ProxyMetrics::observe_time_to_first_byte(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  time_to_first_byte_.observe(seconds);
}

void ProxyMetrics::observe_prefill(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_.observe(seconds);
}

std::string ProxyMetrics::render(const std::vector<PrefillStatus>& prefills,
                                 const std::vector<UpstreamState>& decodes,
                                 const std::string& decode_side) const {
  using prometheus::append_header;
  using prometheus::append_sample;
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  append_header(&out, "crescent_proxy_requests_total", "counter",
                "Client requests by endpoint and outcome.");
  for (size_t e = 0; e < requests_.size(); ++e) {
    for (size_t o = 0; o < requests_[e].size(); ++o) {
      append_sample(&out,
                    std::string("crescent_proxy_requests_total{endpoint=\"") + endpoint_label(e) +
                        "\",outcome=\"" + outcome_label(o) + "\"}",
                    static_cast<double>(requests_[e][o]));
    }
  }
  append_header(&out, "crescent_proxy_requests_in_flight", "gauge",
                "Client requests whose answer is not complete yet.");
  append_sample(&out, "crescent_proxy_requests_in_flight", num_in_flight_.load());
  append_header(&out, "crescent_proxy_upstream_errors_total", "counter",
                "Failed upstream calls (cannot connect, broken connection, timeout, error "
                "status) by side.");
  append_sample(&out, "crescent_proxy_upstream_errors_total{side=\"prefill\"}",
                static_cast<double>(upstream_errors_[0]));
  append_sample(&out, "crescent_proxy_upstream_errors_total{side=\"decode\"}",
                static_cast<double>(upstream_errors_[1]));
  if (!encoder_urls_.empty()) {
    append_sample(&out, "crescent_proxy_upstream_errors_total{side=\"encoder\"}",
                  static_cast<double>(upstream_errors_[2]));
  }
  append_header(&out, "crescent_proxy_time_to_first_byte_seconds", "histogram",
                "From a completion request's arrival to the first byte of its answer.");
  time_to_first_byte_.render("crescent_proxy_time_to_first_byte_seconds", &out);
  append_header(&out, "crescent_proxy_prefill_seconds", "histogram",
                "From a completion request's arrival to its prefill server's answer.");
  prefill_.render("crescent_proxy_prefill_seconds", &out);
  append_header(&out, "crescent_proxy_prefill_ready", "gauge",
                "1 when the prefill server and its bootstrap server answered the last poll, "
                "else 0.");
  for (const auto& p : prefills) {
    append_sample(&out, "crescent_proxy_prefill_ready{prefill=\"" + p.url + "\"}",
                  p.is_ready && p.is_up ? 1 : 0);
  }
  append_header(&out, "crescent_proxy_prefill_dp_size", "gauge",
                "Data-parallel ranks of each ready prefill server (0 until ready).");
  for (const auto& p : prefills) {
    append_sample(&out, "crescent_proxy_prefill_dp_size{prefill=\"" + p.url + "\"}", p.dp_size);
  }
  if (!decodes.empty()) {
    append_header(&out, "crescent_proxy_upstream_up", "gauge",
                  "1 while the server is in rotation; 0 after a call could not reach it, until a "
                  "/health probe answers 200.");
    for (const auto& d : decodes) {
      append_sample(
          &out,
          "crescent_proxy_upstream_up{side=\"" + decode_side + "\",upstream=\"" + d.url + "\"}",
          d.is_up ? 1 : 0);
    }
    append_header(&out, "crescent_proxy_upstream_ejections_total", "counter",
                  "Times the server was taken out of rotation because a call could not reach it.");
    for (const auto& d : decodes) {
      append_sample(&out,
                    "crescent_proxy_upstream_ejections_total{side=\"" + decode_side +
                        "\",upstream=\"" + d.url + "\"}",
                    static_cast<double>(d.num_ejections));
    }
  }
  if (!router_decisions_.empty()) {
    append_header(&out, "crescent_proxy_router_decisions_total", "counter",
                  "Prefill servers picked, by router and why (docs/proxy.md).");
    for (const auto& [key, n] : router_decisions_) {
      append_sample(&out,
                    "crescent_proxy_router_decisions_total{router=\"" + key.first + "\",reason=\"" +
                        key.second + "\"}",
                    static_cast<double>(n));
    }
  }
  if (router_index_entries_.load() >= 0) {
    append_header(&out, "crescent_proxy_router_matched_blocks_total", "counter",
                  "kv_aware: prompt blocks the chosen prefill already held (its prefix cache).");
    append_sample(&out, "crescent_proxy_router_matched_blocks_total",
                  static_cast<double>(router_matched_blocks_));
    append_header(&out, "crescent_proxy_router_prompt_blocks_total", "counter",
                  "kv_aware: full prompt blocks of the requests routed.");
    append_sample(&out, "crescent_proxy_router_prompt_blocks_total",
                  static_cast<double>(router_prompt_blocks_));
    append_header(&out, "crescent_proxy_router_index_entries", "gauge",
                  "kv_aware: block hashes in the KV index.");
    append_sample(&out, "crescent_proxy_router_index_entries",
                  static_cast<double>(router_index_entries_.load()));
  }
  if (!encoder_urls_.empty()) {
    append_header(&out, "crescent_proxy_encoder_requests_total", "counter",
                  "Images sent to each encoder server (one request per image).");
    for (size_t i = 0; i < encoder_urls_.size(); ++i) {
      append_sample(&out,
                    "crescent_proxy_encoder_requests_total{encoder=\"" + encoder_urls_[i] + "\"}",
                    static_cast<double>(encoder_requests_[i]));
    }
    append_header(&out, "crescent_proxy_encoder_failures_total", "counter",
                  "Encoder calls that failed (error status, unreachable, timeout, bad answer).");
    for (size_t i = 0; i < encoder_urls_.size(); ++i) {
      append_sample(&out,
                    "crescent_proxy_encoder_failures_total{encoder=\"" + encoder_urls_[i] + "\"}",
                    static_cast<double>(encoder_failures_[i]));
    }
    append_header(&out, "crescent_proxy_encoder_affinity_total", "counter",
                  "Images sent to the encoder they were sent to before (its cache may hold them).");
    append_sample(&out, "crescent_proxy_encoder_affinity_total",
                  static_cast<double>(encoder_affinity_));
    append_header(&out, "crescent_proxy_encode_seconds", "histogram",
                  "From a request's first encoder call to its last encoder answer.");
    encode_.render("crescent_proxy_encode_seconds", &out);
  }
  return out;
}

}  // namespace crescent::proxy
