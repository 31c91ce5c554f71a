#pragma once
// A request-rate sweep of two deployments (`scripts/demo.sh sweep`: 1P1D and colocated, the
// same load at each rate): a table of goodput, TPOT p99, ITL p99 and TTFT median per rate, a
// sentence naming where the goodput winner changes (the crossover), and an SVG chart of
// goodput and TPOT p99 against the offered rate. Reads `crescent bench serve --save-result`
// files measured with the same --goodput SLOs. Pure functions; no I/O.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::bench {

struct SweepPoint {
  double rate = 0;  // offered request rate (req/s)
  double goodput = 0;
  int64_t good = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  double p99_tpot_ms = 0;
  double p99_itl_ms = 0;
  double median_ttft_ms = 0;
};

struct SweepSeries {
  std::string label;
  std::vector<SweepPoint> points;  // ascending rate
  std::string slos;                // "itl <= 250, ttft <= 3000 ms"
};

// One result file's point; `what` names it in errors. It needs a finite request_rate and a
// goodput (the run had --goodput).
Result<SweepPoint> sweep_point(const nlohmann::json& result, const std::string& what);

// The series of a label from its result files (any order): sorted by rate, one point per rate,
// all under the same SLOs.
Result<SweepSeries> sweep_series(std::string label, const std::vector<nlohmann::json>& results,
                                 const std::vector<std::string>& names);

// Checks that a and b were swept over the same rates under the same SLOs.
Status check_comparable(const SweepSeries& a, const SweepSeries& b);

// Per rate: A and B side by side (goodput with its ratio, TPOT p99, ITL p99, TTFT median).
std::string sweep_table(const SweepSeries& a, const SweepSeries& b);

// Which side has the higher goodput at each rate (differences under 10% read as a tie) and
// where that changes: "crossover between 1.00 and 2.00 req/s: ..." or why there is none.
std::string sweep_sentence(const SweepSeries& a, const SweepSeries& b);

// Goodput and TPOT p99 against the offered rate, both series, the crossover marked.
std::string render_sweep_svg(const SweepSeries& a, const SweepSeries& b, const std::string& title);

}  // namespace crescent::bench
