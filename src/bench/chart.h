#pragma once
// An SVG chart of a run, for a human to open in a browser: histograms of TTFT, TPOT, ITL and
// end-to-end latency (with mean, median and p99 marked), and TTFT and TPOT of each request
// against the time it was sent (failed requests marked on the time axis). Self-contained
// SVG 1.1, no scripts. Pure function.

#include <string>
#include <vector>

#include "bench/metrics.h"
#include "bench/request_output.h"

namespace crescent::bench {

// title: one line shown on top (model, rate, ...).
std::string render_chart_svg(const std::vector<RequestOutput>& outputs,
                             const BenchmarkMetrics& metrics, const std::string& title);

}  // namespace crescent::bench
