#pragma once
// The report of `crescent bench disagg` (pd_bench.h): the TTFT breakdown by phase, one row per
// request, and the KV transfer against the memcpy baselines, as text and as JSON. Pure
// functions of the figures.

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/disagg/pd_bench.h"

namespace crescent::bench {

// The verdict compares bests (the fastest of each is the least disturbed by other work on a
// shared machine); the target applies to shm only. Needs measured requests and every copy kind.
void print_pd_report(const PdBenchOptions& o, const PdBenchResult& r, std::FILE* out);
nlohmann::ordered_json pd_report_json(const PdBenchOptions& o, const PdBenchResult& r);

// A request's name in the report and the progress lines: "warm-up" or "#3".
std::string pd_request_label(bool is_warmup, int index);

}  // namespace crescent::bench
