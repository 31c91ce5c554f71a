// `crescent bench sweep-report`: two deployments' request-rate sweeps (`crescent bench serve
// --save-result` files, one per rate, measured with the same --goodput SLOs) side by side per
// rate, a sentence naming the goodput crossover, and an SVG chart of goodput and TPOT p99
// against the rate. scripts/demo.sh sweep uses it; the logic is src/bench/sweep_report.h.

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "bench/report.h"
#include "bench/sweep_report.h"
#include "core/status.h"

namespace crescent::apps {
namespace {

using Json = nlohmann::json;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) {
    if (!item.empty()) {
      out.push_back(item);
    }
  }
  return out;
}

Result<bench::SweepSeries> load_series(const std::string& label, const std::string& list) {
  std::vector<std::string> paths = split_commas(list);
  std::vector<Json> results;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(Json j, bench::read_result_file(path));
    results.push_back(std::move(j));
  }
  return bench::sweep_series(label, results, paths);
}

int run_bench_sweep_report(const std::vector<std::string>& args) {
  std::string labels = "A,B";
  std::string svg_path;
  std::string title = "Request-rate sweep";
  FlagParser flags(
      "crescent bench sweep-report [--labels A,B] [--svg FILE.svg] [--title TEXT] "
      "A1.json,A2.json,... B1.json,B2.json,...",
      "Two deployments swept over the same request rates (one `crescent bench serve\n"
      "--save-result` file per rate, each list comma-separated, any order; every run with the\n"
      "same --goodput SLOs): per rate, goodput with the ratio A/B, TPOT p99, ITL p99 and TTFT\n"
      "median; then a sentence naming where the higher goodput passes from one to the other\n"
      "(differences under 10% read as a tie). --svg draws goodput and TPOT p99 against the\n"
      "rate. Exit status: 0, 1 for files that cannot be read or compared, 2 for bad usage.");
  flags.add("labels", &labels, "the two deployments' names, comma-separated");
  flags.add("svg", &svg_path, "write the chart here");
  flags.add("title", &title, "the chart's title");
  if (int code = flags.parse_or_exit_code(args); code >= 0) {
    return code;
  }
  std::vector<std::string> names = split_commas(labels);
  if (names.size() != 2) {
    std::fprintf(stderr, "error: --labels expects two names, A,B; got '%s'\n", labels.c_str());
    return 2;
  }
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "error: expected two comma-separated lists of result files, got %zu\n\n%s",
                 flags.positional().size(), flags.help_text().c_str());
    return 2;
  }
  auto a = load_series(names[0], flags.positional()[0]);
  auto b = a.is_ok() ? load_series(names[1], flags.positional()[1]) : a;
  Status comparable = !a.is_ok()   ? a.status()
                      : !b.is_ok() ? b.status()
                                   : bench::check_comparable(*a, *b);
  if (!comparable.is_ok()) {
    std::fprintf(stderr, "error: %s\n", comparable.message().c_str());
    return 1;
  }
  std::printf("%s", bench::sweep_table(*a, *b).c_str());
  std::printf("%s\n", bench::sweep_sentence(*a, *b).c_str());
  if (!svg_path.empty()) {
    std::ofstream out(svg_path);
    out << bench::render_sweep_svg(*a, *b, title);
    if (!out.flush()) {
      std::fprintf(stderr, "error: cannot write %s\n", svg_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_sweep_report, "bench sweep-report",
                          "two request-rate sweeps side by side, with the goodput crossover",
                          run_bench_sweep_report)
}  // namespace crescent::apps
