#pragma once
// When each request of a run is sent, as `vllm bench serve` schedules it: gaps drawn from a
// gamma distribution with shape = burstiness and mean = 1 / rate (burstiness 1 is a Poisson
// process; < 1 burstier, > 1 more even), summed, then scaled so that the last request is sent
// at exactly num_requests / rate (vLLM does this to take the seed's noise out of the
// throughput). An infinite rate sends everything at time 0.

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace crescent::bench {

struct ArrivalOptions {
  double request_rate = 0;  // requests/s; +inf: all at once
  double burstiness = 1;    // gamma shape; +inf: evenly spaced
  uint64_t seed = 0;
};

// Offsets in seconds from the start of the run, non-decreasing. InvalidArgument for a rate
// or burstiness that is not > 0.
Result<std::vector<double>> arrival_offsets_s(int64_t num_requests, const ArrivalOptions& options);

}  // namespace crescent::bench
