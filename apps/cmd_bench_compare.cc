// `crescent bench compare A.json B.json`: two `crescent bench serve --save-result` files side by
// side (TTFT, TPOT, ITL, end-to-end latency, throughput, failures) with the ratio A/B, then one
// sentence on what differs, written from the numbers. scripts/demo.sh uses it to set a 1P1D
// run beside a colocated one; `--explain pd` adds why, assuming A is disaggregated.

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "bench/report.h"
#include "core/status.h"

namespace crescent::apps {
namespace {

using Json = nlohmann::json;

struct BenchRun {
  std::string path;
  std::string label;
  Json result;
};

// Differences under this fraction read as "about the same": this machine's runs vary that much.
constexpr double kSameWithin = 0.10;

std::optional<double> number(const Json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return std::nullopt;
  }
  return it->get<double>();
}

Result<BenchRun> load_run(const std::string& path) {
  ASSIGN_OR_RETURN(Json j, bench::read_result_file(path));
  for (const char* key : {"completed", "failed", "duration", "request_throughput",
                          "output_throughput", "median_ttft_ms", "median_tpot_ms"}) {
    if (!number(j, key)) {
      return invalid_argument(path + " has no number '" + key +
                              "' (is it a `crescent bench serve --save-result` file with the "
                              "default --percentile-metrics?)");
    }
  }
  BenchRun run;
  run.path = path;
  if (auto it = j.find("label");
      it != j.end() && it->is_string() && !it->get<std::string>().empty()) {
    run.label = it->get<std::string>();
  }
  run.result = std::move(j);
  return run;
}

std::string format_value(std::optional<double> v, int decimals) {
  if (!v) {
    return "-";
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, *v);
  return buf;
}

std::optional<double> ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b == 0) {
    return std::nullopt;
  }
  return *a / *b;
}

std::string format_ratio(std::optional<double> r) {
  if (!r) {
    return "-";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", *r);
  return buf;
}

struct Row {
  const char* title;  // empty key: a section header
  const char* key;
  int decimals;
  bool is_optional = false;  // left out when neither file has it (a --metric-percentiles choice)
};

constexpr Row kRows[] = {
    {"Successful requests", "completed", 0},
    {"Failed requests", "failed", 0},
    {"Benchmark duration (s)", "duration", 2},
    {"Request throughput (req/s)", "request_throughput", 2},
    {"Output token throughput (tok/s)", "output_throughput", 2},
    {"Request goodput (req/s)", "request_goodput", 2, true},
    {"Requests within every SLO", "good_requests", 0, true},
    {"Peak concurrent requests", "max_concurrent_requests", 0},
    {"Time to First Token", "", 0},
    {"Mean TTFT (ms)", "mean_ttft_ms", 2},
    {"Median TTFT (ms)", "median_ttft_ms", 2},
    {"P90 TTFT (ms)", "p90_ttft_ms", 2, true},
    {"P99 TTFT (ms)", "p99_ttft_ms", 2},
    {"Time per Output Token (excl. 1st token)", "", 0},
    {"Mean TPOT (ms)", "mean_tpot_ms", 2},
    {"Median TPOT (ms)", "median_tpot_ms", 2},
    {"P90 TPOT (ms)", "p90_tpot_ms", 2, true},
    {"P99 TPOT (ms)", "p99_tpot_ms", 2},
    {"Inter-token Latency", "", 0},
    {"Median ITL (ms)", "median_itl_ms", 2},
    {"P90 ITL (ms)", "p90_itl_ms", 2, true},
    {"P99 ITL (ms)", "p99_itl_ms", 2},
    {"End-to-end Latency", "", 0},
    {"Mean E2EL (ms)", "mean_e2el_ms", 2},
    {"Median E2EL (ms)", "median_e2el_ms", 2, true},
    {"P99 E2EL (ms)", "p99_e2el_ms", 2},
};

std::string pad_right(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}
std::string pad_left(const std::string& s, size_t width) {
  return s.size() >= width ? " " + s : std::string(width - s.size(), ' ') + s;
}

std::string table(const BenchRun& a, const BenchRun& b) {
  constexpr size_t kTitle = 42;
  constexpr size_t kValue = 13;
  constexpr size_t kRatio = 9;
  const size_t width = kTitle + 2 * kValue + kRatio;
  std::string out;
  out += pad_right("", kTitle) + pad_left(a.label, kValue) + pad_left(b.label, kValue) +
         pad_left("A/B", kRatio) + "\n";
  out += std::string(width, '=') + "\n";
  for (const Row& row : kRows) {
    if (row.key[0] == '\0') {
      std::string title = std::string("-- ") + row.title + " ";
      out += title + std::string(width > title.size() ? width - title.size() : 0, '-') + "\n";
      continue;
    }
    auto va = number(a.result, row.key);
    auto vb = number(b.result, row.key);
    if (!va && !vb && row.is_optional) {
      continue;
    }
    std::string line = pad_right(row.title, kTitle) +
                       pad_left(format_value(va, row.decimals), kValue) +
                       pad_left(format_value(vb, row.decimals), kValue);
    if (row.decimals > 0) {  // counts get no ratio
      line += pad_left(format_ratio(ratio(va, vb)), kRatio);
    }
    out += line + "\n";
  }
  out += std::string(width, '=') + "\n";
  return out;
}

std::string mean_per_request(const Json& j, const char* total_key) {
  auto total = number(j, total_key);
  auto completed = number(j, "completed");
  if (!total || !completed || *completed == 0) {
    return "?";
  }
  return format_value(*total / *completed, 0);
}

// "random prompts, 40 requests, ~512 in / ~64 out tokens each, 2.00 req/s (Poisson)".
std::string shape(const Json& j) {
  std::string out;
  if (auto it = j.find("dataset_name"); it != j.end() && it->is_string()) {
    out += it->get<std::string>() + " prompts, ";
  }
  out += format_value(number(j, "completed").value_or(0) + number(j, "failed").value_or(0), 0) +
         " requests, ~" + mean_per_request(j, "total_input_tokens") + " in / ~" +
         mean_per_request(j, "total_output_tokens") + " out tokens each";
  if (auto rate = number(j, "request_rate")) {
    out += ", " + format_value(*rate, 2) + " req/s";
    auto burstiness = number(j, "burstiness");
    if (burstiness && *burstiness == 1.0) {
      out += " (Poisson)";
    }
  } else {
    out += ", all at once";
  }
  if (auto c = number(j, "max_concurrency")) {
    out += ", at most " + format_value(*c, 0) + " in flight";
  }
  return out;
}

// The run settings that must match for the comparison to mean anything.
std::vector<std::string> setting_differences(const Json& a, const Json& b) {
  std::vector<std::string> out;
  for (const char* key : {"dataset_name", "num_prompts", "seed", "request_rate", "burstiness",
                          "max_concurrency", "goodput_slos_ms"}) {
    Json va = a.value(key, Json());
    Json vb = b.value(key, Json());
    if (va != vb) {
      out.push_back(std::string(key) + " " + va.dump() + " vs " + vb.dump());
    }
  }
  return out;
}

enum class Direction { kLower, kSame, kHigher };

Direction direction(double r) {
  if (r < 1.0 - kSameWithin) {
    return Direction::kLower;
  }
  if (r > 1.0 + kSameWithin) {
    return Direction::kHigher;
  }
  return Direction::kSame;
}

// One figure of a finding: "TPOT" + "p99" reads "TPOT p99".
struct Figure {
  const char* statistic;  // "p99", "median"; empty for a figure on its own
  const char* key;
};

// A kind of figure the sentence talks about. Of its figures, the one that differs most (as a
// ratio) leads; the other follows as a ratio.
struct Finding {
  const char* what;  // "TPOT"
  Figure first;
  Figure second;  // key nullptr: none
  const char* unit;
  // Why, when A is disaggregated and B colocated, for A lower / higher than B.
  const char* why_lower;
  const char* why_higher;
};

constexpr Finding kFindings[] = {
    {"TPOT",
     {"p99", "p99_tpot_ms"},
     {"median", "median_tpot_ms"},
     " ms",
     "the decode engine's steps never wait behind a prefill",
     "the decode engine has only part of the cores, and prefills seldom stalled the colocated "
     "server's decode steps"},
    {"TTFT",
     {"median", "median_ttft_ms"},
     {"p99", "p99_ttft_ms"},
     " ms",
     "prompts never queue behind the colocated server's decode steps",
     "each prompt goes through the proxy, is prefilled on part of the cores, and its KV "
     "crosses to the decode engine before the first token"},
    {"output throughput",
     {"", "output_throughput"},
     {"", nullptr},
     " tok/s",
     "neither engine can lend its cores to the other when it idles",
     "prefill and decode run in parallel on their own cores"},
};

std::string figure_name(const Finding& f, const Figure& figure) {
  return figure.statistic[0] == '\0' ? f.what : std::string(f.what) + " " + figure.statistic;
}

// The goodput finding, when both runs measured it under the same SLOs: how many requests met
// them on each side, and which SLO made the difference (the one whose misses differ most).
// "" otherwise.
std::string goodput_finding(const BenchRun& a, const BenchRun& b, bool explain_pd) {
  const std::string slos = bench::goodput_slos_text(a.result);
  auto ga = number(a.result, "request_goodput");
  auto gb = number(b.result, "request_goodput");
  if (!ga || !gb || slos.empty() || slos != bench::goodput_slos_text(b.result)) {
    return "";
  }
  auto requests = [](const Json& j) {
    return number(j, "completed").value_or(0) + number(j, "failed").value_or(0);
  };
  // B's goodput 0: no ratio to give.
  const std::string how = ratio(ga, gb) ? format_ratio(ratio(ga, gb))
                          : *ga > 0     ? "above zero only for " + a.label
                                        : std::string("zero for both");
  std::string out = "goodput is " + how + " (" + format_value(ga, 2) + " vs " +
                    format_value(gb, 2) +
                    " req/s: " + format_value(number(a.result, "good_requests"), 0) + " of " +
                    format_value(requests(a.result), 0) + " vs " +
                    format_value(number(b.result, "good_requests"), 0) + " of " +
                    format_value(requests(b.result), 0) + " requests within " + slos;
  // Misses per SLO on each side (failed requests miss every one).
  std::string decisive;
  double most = 0;
  double decisive_a = 0;
  double decisive_b = 0;
  const Json met_a = a.result.value("slo_met_requests", Json::object());
  const Json met_b = b.result.value("slo_met_requests", Json::object());
  for (const auto& [key, value] : a.result["goodput_slos_ms"].items()) {
    if (!met_a.contains(key) || !met_b.contains(key) || !met_a[key].is_number() ||
        !met_b[key].is_number()) {
      continue;
    }
    const double miss_a = requests(a.result) - met_a[key].get<double>();
    const double miss_b = requests(b.result) - met_b[key].get<double>();
    if (std::abs(miss_a - miss_b) > most) {
      most = std::abs(miss_a - miss_b);
      decisive = key;
      decisive_a = miss_a;
      decisive_b = miss_b;
    }
  }
  if (!decisive.empty()) {
    out += "; " + decisive + " missed by " + format_value(decisive_a, 0) + " vs " +
           format_value(decisive_b, 0);
  }
  out += ")";
  if (explain_pd && !decisive.empty()) {
    const bool a_fewer = decisive_a < decisive_b;
    const bool decode_side = decisive == "tpot" || decisive == "itl";
    out += ": ";
    if (decode_side) {
      out += a_fewer ? "the decode engine's steps never wait behind a prefill, while the "
                       "colocated server's running requests stall behind each long prefill step"
                     : "the decode engine has only part of the cores, and prefills seldom "
                       "stalled the colocated server's decode steps";
    } else if (decisive == "ttft") {
      out += a_fewer ? "prompts never queue behind the colocated server's decode steps"
                     : "each prompt is prefilled on part of the cores, and its KV crosses to the "
                       "decode engine before the first token";
    } else {
      out += a_fewer ? "requests finish sooner end to end" : "requests take longer end to end";
    }
  }
  return out;
}

std::string sentence(const BenchRun& a, const BenchRun& b, bool explain_pd) {
  std::string out = a.label + " vs " + b.label + ":";
  bool first = true;
  if (std::string goodput = goodput_finding(a, b, explain_pd); !goodput.empty()) {
    out += " " + goodput;
    first = false;
  }
  std::vector<std::string> same;
  for (const Finding& f : kFindings) {
    const Figure* lead = &f.first;
    const Figure* other = f.second.key != nullptr ? &f.second : nullptr;
    auto r = ratio(number(a.result, lead->key), number(b.result, lead->key));
    std::optional<double> r_other;
    if (other != nullptr) {
      r_other = ratio(number(a.result, other->key), number(b.result, other->key));
      if (r_other && (!r || std::abs(std::log(*r_other)) > std::abs(std::log(*r)))) {
        std::swap(lead, other);
        std::swap(r, r_other);
      }
    }
    if (!r) {
      continue;
    }
    Direction d = direction(*r);
    if (d == Direction::kSame) {
      same.push_back(f.what);
      continue;
    }
    out += first ? " " : "; ";
    first = false;
    out += figure_name(f, *lead) + " is " + format_ratio(r) + " (" +
           format_value(number(a.result, lead->key), 1) + " vs " +
           format_value(number(b.result, lead->key), 1) + f.unit;
    if (other != nullptr && r_other) {
      out += std::string(", ") + other->statistic + " " + format_ratio(r_other);
    }
    out += ")";
    if (explain_pd) {
      out += std::string(": ") + (d == Direction::kLower ? f.why_lower : f.why_higher);
    }
  }
  if (!same.empty()) {
    out += first ? " " : "; ";
    std::string list;
    for (size_t i = 0; i < same.size(); ++i) {
      list += (i == 0 ? "" : (i + 1 == same.size() ? " and " : ", ")) + same[i];
    }
    out += list + " within " + format_value(kSameWithin * 100, 0) + "%";
  }
  out += ".";
  double failed_a = number(a.result, "failed").value_or(0);
  double failed_b = number(b.result, "failed").value_or(0);
  if (failed_a > 0 || failed_b > 0) {
    out += " Failed requests: " + format_value(failed_a, 0) + " (" + a.label + ") and " +
           format_value(failed_b, 0) + " (" + b.label +
           "): their errors are in the JSON files' first_errors and the servers' logs.";
  }
  return out;
}

int run_bench_compare(const std::vector<std::string>& args) {
  std::string labels;
  std::string explain = "none";
  FlagParser flags(
      "crescent bench compare [--labels A,B] [--explain none|pd] A.json B.json",
      "Sets two `crescent bench serve --save-result` files side by side: requests, throughput,\n"
      "TTFT, TPOT, ITL and end-to-end latency with the ratio A/B, then one sentence on what\n"
      "differs by more than 10%, written from the numbers. With --explain pd the sentence says\n"
      "why, reading A as a disaggregated (prefill/decode) deployment and B as a colocated one.\n"
      "Exit status: 0, or 1 for a file that cannot be read, 2 for bad usage.");
  flags.add("labels", &labels,
            "column names, comma-separated (default: each file's label, else A and B)");
  flags.add("explain", &explain, "none, or pd: add why, A disaggregated and B colocated");
  if (int code = flags.parse_or_exit_code(args); code >= 0) {
    return code;
  }
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "error: expected two result files (A.json B.json), got %zu\n\n%s",
                 flags.positional().size(), flags.help_text().c_str());
    return 2;
  }
  if (explain != "none" && explain != "pd") {
    std::fprintf(stderr, "error: --explain expects none or pd, got '%s'\n", explain.c_str());
    return 2;
  }
  std::vector<BenchRun> runs;
  for (const std::string& path : flags.positional()) {
    auto run = load_run(path);
    if (!run.is_ok()) {
      std::fprintf(stderr, "error: %s\n", run.status().message().c_str());
      return 1;
    }
    runs.push_back(std::move(*run));
  }
  if (!labels.empty()) {
    auto comma = labels.find(',');
    if (comma == std::string::npos || comma == 0 || comma + 1 == labels.size() ||
        labels.find(',', comma + 1) != std::string::npos) {
      std::fprintf(stderr, "error: --labels expects two names, A,B; got '%s'\n", labels.c_str());
      return 2;
    }
    runs[0].label = labels.substr(0, comma);
    runs[1].label = labels.substr(comma + 1);
  }
  if (runs[0].label.empty()) {
    runs[0].label = "A";
  }
  if (runs[1].label.empty()) {
    runs[1].label = "B";
  }

  std::printf("Benchmark: %s\n", shape(runs[0].result).c_str());
  for (const std::string& d : setting_differences(runs[0].result, runs[1].result)) {
    std::printf("note: the runs differ in %s: the comparison is not like for like\n", d.c_str());
  }
  std::printf("%s", table(runs[0], runs[1]).c_str());
  std::printf("%s\n", sentence(runs[0], runs[1], explain == "pd").c_str());
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_compare, "bench compare",
                          "two bench serve results side by side, with what differs",
                          run_bench_compare)
}  // namespace crescent::apps
