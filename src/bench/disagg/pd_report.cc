#include "bench/disagg/pd_report.h"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "bench/metrics.h"

namespace crescent::bench {
namespace {

using Json = nlohmann::ordered_json;

struct Phase {
  const char* name;
  const char* key;
  double PdRequestFigures::*field;
};

// The TTFT rows: proxy .. other add up to the client's TTFT.
constexpr Phase kPhases[] = {
    {"proxy (client TTFT - D's TTFT)", "proxy_s", &PdRequestFigures::proxy_s},
    {"bootstrap lookup", "bootstrap_s", &PdRequestFigures::bootstrap_s},
    {"wait (P queue + prefill)", "wait_s", &PdRequestFigures::wait_s},
    {"transfer (P's write)", "transfer_s", &PdRequestFigures::transfer_s},
    {"decode-side recompute", "recompute_s", &PdRequestFigures::recompute_s},
    {"other (connect, ASK/DONE)", "other_s", &PdRequestFigures::other_s},
};
constexpr Phase kTotals[] = {
    {"client TTFT", "client_ttft_s", &PdRequestFigures::client_ttft_s},
    {"  D's server TTFT", "d_ttft_s", &PdRequestFigures::d_ttft_s},
    {"  D's fetch", "fetch_s", &PdRequestFigures::fetch_s},
    {"  D's time per output token", "d_tpot_s", &PdRequestFigures::d_tpot_s},
    {"  P's server TTFT", "p_ttft_s", &PdRequestFigures::p_ttft_s},
    {"  P's write (P /metrics)", "p_write_s", &PdRequestFigures::p_write_s},
    {"client end-to-end", "e2e_s", &PdRequestFigures::e2e_s},
};

const std::span<const Phase> kAllPhaseTables[] = {kPhases, kTotals};

std::vector<double> column(const std::vector<PdRequestFigures>& figures,
                           double PdRequestFigures::*field) {
  std::vector<double> v;
  for (const PdRequestFigures& f : figures) {
    if (!f.is_warmup) {
      v.push_back(f.*field);
    }
  }
  return v;
}

double min_of(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

const std::vector<double>& copy_samples(const PdBenchResult& r, CopyKind kind) {
  static const std::vector<double> kNone;
  auto it = r.copy_s.find(kind);
  return it == r.copy_s.end() ? kNone : it->second;
}

}  // namespace

// snprintf, because GCC 12 warns falsely on "#" + std::to_string.
std::string pd_request_label(bool is_warmup, int index) {
  if (is_warmup) {
    return "warm-up";
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%d", index);
  return buf;
}

void print_pd_report(const PdBenchOptions& o, const PdBenchResult& r, std::FILE* out) {
  std::fprintf(out,
               "\nTTFT breakdown, %d requests at concurrency 1 (%d-token prompts, %d output "
               "tokens), ms:\n",
               o.num_requests, o.prompt_len, o.output_len);
  std::fprintf(out, "  %-34s %10s %10s %8s\n", "phase", "mean", "median", "share");
  double ttft_mean = mean(column(r.figures, &PdRequestFigures::client_ttft_s));
  for (const Phase& p : kPhases) {
    std::vector<double> v = column(r.figures, p.field);
    std::fprintf(out, "  %-34s %10.2f %10.2f %7.1f%%\n", p.name, mean(v) * 1e3, median(v) * 1e3,
                 ttft_mean > 0 ? 100 * mean(v) / ttft_mean : 0.0);
  }
  for (const Phase& p : kTotals) {
    std::vector<double> v = column(r.figures, p.field);
    std::fprintf(out, "  %-34s %10.2f %10.2f\n", p.name, mean(v) * 1e3, median(v) * 1e3);
  }

  std::fprintf(out, "\nper request, ms (the warm-up row is not counted):\n");
  std::fprintf(out, "  %-8s %10s %8s %9s %10s %9s %9s %7s %10s %9s %9s\n", "request", "TTFT",
               "proxy", "bootstrap", "wait", "transfer", "recompute", "other", "P TTFT", "P faults",
               "D faults");
  for (size_t i = 0; i < r.figures.size(); ++i) {
    const PdRequestFigures& f = r.figures[i];
    std::fprintf(out, "  %-8s %10.1f %8.2f %9.3f %10.1f %9.2f %9.2f %7.2f %10.1f %9lld %9lld\n",
                 pd_request_label(f.is_warmup, static_cast<int>(i)).c_str(), f.client_ttft_s * 1e3,
                 f.proxy_s * 1e3, f.bootstrap_s * 1e3, f.wait_s * 1e3, f.transfer_s * 1e3,
                 f.recompute_s * 1e3, f.other_s * 1e3, f.p_ttft_s * 1e3,
                 static_cast<long long>(f.p_minor_faults),
                 static_cast<long long>(f.d_minor_faults));
  }
  double hits = 0;
  for (const PdRequestFigures& f : r.figures) {
    hits += f.d_prefix_hit_tokens + f.p_prefix_hit_tokens;
  }
  std::fprintf(out, "  prefix-cache hit tokens over all requests (P + D): %.0f\n", hits);

  std::vector<double> transfer = column(r.figures, &PdRequestFigures::transfer_s);
  const std::vector<double>& base = copy_samples(r, CopyKind::kTouched);
  double mib = static_cast<double>(r.num_bytes) / (1 << 20);
  auto gbps = [&](double s) { return s > 0 ? static_cast<double>(r.num_bytes) / s / 1e9 : 0.0; };
  std::fprintf(out, "\nKV transfer vs memcpy, %llu bytes (%.1f MiB) per request:\n",
               static_cast<unsigned long long>(r.num_bytes), mib);
  std::fprintf(out, "  %-44s %9s %9s %9s\n", "", "median ms", "best ms", "GB/s med");
  std::fprintf(out, "  %-44s %9.2f %9.2f %9.2f\n",
               ("transfer, " + o.kv_transport + " (P's write, " + std::to_string(transfer.size()) +
                " requests)")
                   .c_str(),
               median(transfer) * 1e3, min_of(transfer) * 1e3, gbps(median(transfer)));
  for (CopyKind kind : kCopyKinds) {
    const std::vector<double>& v = copy_samples(r, kind);
    std::fprintf(out, "  %-44s %9.2f %9.2f %9.2f\n", copy_kind_name(kind), median(v) * 1e3,
                 min_of(v) * 1e3, gbps(median(v)));
  }
  double best_ratio = min_of(base) > 0 ? min_of(transfer) / min_of(base) : 0;
  double median_ratio = median(base) > 0 ? median(transfer) / median(base) : 0;
  std::fprintf(out, "  transfer / memcpy: %.2f (bests), %.2f (medians)   %s\n", best_ratio,
               median_ratio,
               shm_target_verdict(o.kv_transport, best_ratio, o.target_ratio, "(bests) ").c_str());
  std::fprintf(out, "  (memcpy: %d samples of each kind, fresh buffers, timed between requests)\n",
               static_cast<int>(base.size()));
  std::fprintf(out, "\nload average: %s at start, %s at end (%d cores)\n", r.load_at_start.c_str(),
               r.load_at_end.c_str(), r.num_cores);
}

Json pd_report_json(const PdBenchOptions& o, const PdBenchResult& r) {
  Json j;
  j["model"] = o.model;
  j["kv_transport"] = o.kv_transport;
  j["num_requests"] = o.num_requests;
  j["prompt_len"] = o.prompt_len;
  j["output_len"] = o.output_len;
  j["num_cores"] = r.num_cores;
  j["prefill_threads"] = r.num_prefill_threads;
  j["decode_threads"] = r.num_decode_threads;
  j["load_average_start"] = r.load_at_start;
  j["load_average_end"] = r.load_at_end;
  j["log_dir"] = o.log_dir;
  Json summary;
  for (std::span<const Phase> table : kAllPhaseTables) {
    for (const Phase& p : table) {
      std::vector<double> v = column(r.figures, p.field);
      summary[p.key] = {{"mean", mean(v)}, {"median", median(v)}};
    }
  }
  j["summary_seconds"] = summary;
  Json requests = Json::array();
  for (const PdRequestFigures& f : r.figures) {
    Json row;
    row["warmup"] = f.is_warmup;
    for (std::span<const Phase> table : kAllPhaseTables) {
      for (const Phase& p : table) {
        row[p.key] = f.*(p.field);
      }
    }
    row["num_bytes"] = static_cast<uint64_t>(f.num_bytes);
    row["num_chunks"] = f.num_chunks;
    row["prefill_minor_faults"] = f.p_minor_faults;
    row["decode_minor_faults"] = f.d_minor_faults;
    row["prefix_hit_tokens"] = f.d_prefix_hit_tokens + f.p_prefix_hit_tokens;
    requests.push_back(row);
  }
  j["requests"] = requests;
  std::vector<double> transfer = column(r.figures, &PdRequestFigures::transfer_s);
  Json copy;
  copy["num_bytes"] = r.num_bytes;
  copy["transfer_seconds"] = {{"median", median(transfer)}, {"best", min_of(transfer)}};
  for (CopyKind kind : kCopyKinds) {
    const std::vector<double>& v = copy_samples(r, kind);
    copy[copy_kind_key(kind)] = {{"median", median(v)}, {"best", min_of(v)}, {"samples", v}};
  }
  const std::vector<double>& base = copy_samples(r, CopyKind::kTouched);
  double best_ratio = min_of(base) > 0 ? min_of(transfer) / min_of(base) : 0;
  copy["ratio_best"] = best_ratio;
  copy["ratio_median"] = median(base) > 0 ? median(transfer) / median(base) : 0;
  copy["target_ratio"] = o.target_ratio;
  copy["target_applies"] = o.kv_transport == "shm";
  copy["pass"] = best_ratio <= o.target_ratio;
  j["transfer_vs_memcpy"] = copy;
  return j;
}

// ---------------------------------------------------------------------------------------------
// The command.

}  // namespace crescent::bench
