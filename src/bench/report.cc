#include "bench/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

namespace crescent::bench {

using json = nlohmann::json;

namespace {

struct MetricNames {
  const char* key;
  const char* short_name;
  const char* header;
};
constexpr MetricNames kMetricNames[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
};

// Python's "{s:{c}^{n}}".format(...): centred, the odd fill character on the right.
std::string centred(const std::string& s, size_t width, char fill) {
  if (s.size() >= width) {
    return s;
  }
  size_t pad = width - s.size();
  return std::string(pad / 2, fill) + s + std::string(pad - pad / 2, fill);
}

// "{:<40} {:<10}" with a string value.
std::string row(const std::string& label, const std::string& value) {
  char line[256];
  std::snprintf(line, sizeof(line), "%-40s %-10s\n", label.c_str(), value.c_str());
  return line;
}
std::string row(const std::string& label, int64_t value) {
  return row(label, std::to_string(value));
}
// "{:<40} {:<10.2f}"
std::string row_f(const std::string& label, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f", value);
  return row(label, std::string(text));
}

// vLLM's p_word: "99" for 99.0, "99.9" for 99.9.
std::string percentile_word(double p) {
  if (std::floor(p) == p && std::abs(p) < 1e15) {
    return std::to_string(static_cast<int64_t>(p));
  }
  return python_float(p);
}

bool is_selected(const RunInfo& info, const std::string& key) {
  return std::find(info.percentile_metrics.begin(), info.percentile_metrics.end(), key) !=
         info.percentile_metrics.end();
}

}  // namespace

std::string python_float(double value) {
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  if (std::isnan(value)) {
    return "nan";
  }
  // Python's repr: the shortest digits that read back as the same double, in fixed notation
  // for exponents in [-4, 16), else in scientific notation.
  char text[64];
  auto sci = std::to_chars(text, text + sizeof(text), value, std::chars_format::scientific);
  std::string_view sci_text(text, static_cast<size_t>(sci.ptr - text));
  std::string_view exponent_text = sci_text.substr(sci_text.find('e') + 1);
  if (!exponent_text.empty() && exponent_text.front() == '+') {
    exponent_text.remove_prefix(1);
  }
  int exponent = 0;
  std::from_chars(exponent_text.data(), exponent_text.data() + exponent_text.size(), exponent);
  if (exponent < -4 || exponent >= 16) {
    return std::string(sci_text);
  }
  auto fixed = std::to_chars(text, text + sizeof(text), value, std::chars_format::fixed);
  std::string s(text, fixed.ptr);
  if (s.find('.') == std::string::npos) {
    s += ".0";
  }
  return s;
}

std::string format_failures(const std::vector<RequestOutput>& outputs, size_t max_shown) {
  std::string text;
  size_t num_shown = 0;
  for (size_t i = 0; i < outputs.size() && num_shown < max_shown; ++i) {
    if (outputs[i].success) {
      continue;
    }
    if (num_shown == 0) {
      text = "Failed requests during benchmark run detected (capping to " +
             std::to_string(max_shown) + "):\n";
    }
    text += "Error " + std::to_string(num_shown) + " (request " + std::to_string(i) +
            "): " + outputs[i].error + "\n";
    ++num_shown;
  }
  return text;
}

std::string format_report(const BenchmarkMetrics& m, const RunInfo& info, double duration_s) {
  std::string out = centred(" Serving Benchmark Result ", 50, '=') + "\n";
  out += row("Successful requests:", m.completed);
  out += row("Failed requests:", m.failed);
  if (info.max_concurrency > 0) {
    out += row("Maximum request concurrency:", info.max_concurrency);
  }
  if (!std::isinf(info.request_rate)) {
    out += row_f("Request rate configured (RPS):", info.request_rate);
  }
  out += row_f("Benchmark duration (s):", duration_s);
  out += row("Total input tokens:", m.total_input);
  out += row("Total generated tokens:", m.total_output);
  if (info.has_images) {
    out += row("Total images sent:", m.total_images_sent);
  }
  out += row_f("Request throughput (req/s):", m.request_throughput);
  if (!info.goodput.empty()) {
    out += row_f("Request goodput (req/s):", m.request_goodput);
  }
  out += row_f("Output token throughput (tok/s):", m.output_throughput);
  if (info.has_images) {
    out += row_f("Image throughput (img/s):", m.image_throughput);
  }
  out += row_f("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  out += row_f("Peak concurrent requests:", static_cast<double>(m.max_concurrent_requests));
  out += row_f("Total Token throughput (tok/s):", m.total_token_throughput);
  for (const auto& names : kMetricNames) {
    if (!is_selected(info, names.key)) {
      continue;
    }
    const LatencyStats& s = m.latency.at(names.key);
    out += centred(names.header, 50, '-') + "\n";
    out += row_f(std::string("Mean ") + names.short_name + " (ms):", s.mean_ms);
    out += row_f(std::string("Median ") + names.short_name + " (ms):", s.median_ms);
    for (const auto& [p, value] : s.percentiles_ms) {
      out += row_f(std::string("P").append(percentile_word(p)) + " " + names.short_name + " (ms):",
                   value);
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

json result_json(const BenchmarkMetrics& m, const RunInfo& info, double duration_s,
                 const std::vector<RequestOutput>& outputs, bool detailed) {
  json j;
  j["date"] = info.date;
  j["endpoint_type"] = info.backend;
  j["backend"] = info.backend;
  j["label"] = info.label.empty() ? json(nullptr) : json(info.label);
  j["model_id"] = info.model_id;
  j["tokenizer_id"] = info.tokenizer_id;
  j["base_url"] = info.base_url;
  j["endpoint"] = info.endpoint;
  j["dataset_name"] = info.dataset_name;
  j["num_prompts"] = info.num_prompts;
  j["seed"] = info.seed;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["burstiness"] = std::isinf(info.burstiness) ? json("inf") : json(info.burstiness);
  j["max_concurrency"] = info.max_concurrency > 0 ? json(info.max_concurrency) : json(nullptr);
  j["duration"] = duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = info.goodput.empty() ? json(nullptr) : json(m.request_goodput);
  j["goodput_slos_ms"] = info.goodput.empty() ? json(nullptr) : json(info.goodput);
  if (!info.goodput.empty()) {  // crescent's: what the goodput is made of
    j["good_requests"] = m.num_good;
    j["slo_met_requests"] = m.slo_met;
  }
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  if (info.has_images) {
    j["total_images_sent"] = m.total_images_sent;
    j["total_images_completed"] = m.total_images_completed;
    j["image_throughput"] = m.image_throughput;
  }
  for (const auto& names : kMetricNames) {
    if (!is_selected(info, names.key)) {
      continue;
    }
    const LatencyStats& s = m.latency.at(names.key);
    std::string key = names.key;
    j["mean_" + key + "_ms"] = s.mean_ms;
    j["median_" + key + "_ms"] = s.median_ms;
    j["std_" + key + "_ms"] = s.std_ms;
    for (const auto& [p, value] : s.percentiles_ms) {
      j[std::string("p").append(percentile_word(p)) + "_" + key + "_ms"] = value;
    }
  }
  json first_errors = json::array();
  for (size_t i = 0; i < outputs.size() && first_errors.size() < 10; ++i) {
    if (!outputs[i].success) {
      first_errors.push_back({{"request", i}, {"error", outputs[i].error}});
    }
  }
  j["first_errors"] = first_errors;
  if (detailed) {
    json input_lens = json::array(), ttfts = json::array(), itls = json::array(),
         latencies = json::array(), start_times = json::array(), queue_times = json::array(),
         texts = json::array(), errors = json::array();
    json num_images = json::array();
    for (const RequestOutput& o : outputs) {
      num_images.push_back(o.num_images);
      input_lens.push_back(o.prompt_len);
      ttfts.push_back(o.ttft_s);
      itls.push_back(o.itl_s);
      latencies.push_back(o.latency_s);
      start_times.push_back(o.start_time_s);
      queue_times.push_back(o.queue_time_s);
      texts.push_back(o.generated_text);
      errors.push_back(o.error);
    }
    j["input_lens"] = input_lens;
    j["output_lens"] = m.output_lens;
    j["ttfts"] = ttfts;
    j["itls"] = itls;
    j["latencies"] = latencies;
    j["start_times"] = start_times;
    j["queue_times"] = queue_times;
    j["generated_texts"] = texts;
    j["errors"] = errors;
    if (info.has_images) {
      j["num_images"] = num_images;
    }
  }
  return j;
}

Result<json> read_result_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return not_found("cannot open " + path);
  }
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument(path +
                            " is not a JSON object (a `crescent bench serve --save-result` file)");
  }
  return j;
}

std::string goodput_slos_text(const json& result) {
  auto it = result.find("goodput_slos_ms");
  if (it == result.end() || !it->is_object() || it->empty()) {
    return "";
  }
  std::string out;
  for (const auto& [key, value] : it->items()) {
    char ms[32] = "?";
    if (value.is_number()) {
      std::snprintf(ms, sizeof(ms), "%.0f", value.get<double>());
    }
    out += (out.empty() ? "" : ", ") + key + " <= " + ms;
  }
  return out + " ms";
}

}  // namespace crescent::bench
