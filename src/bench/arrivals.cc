#include "bench/arrivals.h"

#include <cmath>
#include <random>
#include <string>

namespace crescent::bench {

Result<std::vector<double>> arrival_offsets_s(int64_t num_requests, const ArrivalOptions& options) {
  if (num_requests < 0) {
    return invalid_argument("the number of requests must be >= 0");
  }
  if (!(options.request_rate > 0)) {
    return invalid_argument("--request-rate must be > 0 (or inf), got " +
                            std::to_string(options.request_rate));
  }
  if (!(options.burstiness > 0)) {
    return invalid_argument("--burstiness must be > 0, got " + std::to_string(options.burstiness));
  }
  std::vector<double> offsets(static_cast<size_t>(num_requests), 0.0);
  if (std::isinf(options.request_rate) || offsets.empty()) {
    return offsets;
  }
  std::mt19937_64 rng(options.seed);
  double theta = 1.0 / (options.request_rate * options.burstiness);
  std::gamma_distribution<double> gap(std::isinf(options.burstiness) ? 1.0 : options.burstiness,
                                      theta);
  double t = 0;
  for (auto& offset : offsets) {
    t += std::isinf(options.burstiness) ? 1.0 / options.request_rate : gap(rng);
    offset = t;
  }
  double target_s = static_cast<double>(num_requests) / options.request_rate;
  if (offsets.back() > 0) {
    double scale = target_s / offsets.back();
    for (auto& offset : offsets) {
      offset *= scale;
    }
  }
  return offsets;
}

}  // namespace crescent::bench
