// The sampler on one row of a Qwen-sized vocabulary (151,936 logits), against two baselines
// timed in the same run: the scalar reference (a double exp per token and a linear draw, what
// the sampler did before it used the kernels' vector exp) and one read pass over the row (the
// floor: any sampler reads every logit at least once).
// usage: sampler_bench [rows (default 2000)] [vocab (default 151936)]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;

double micros_per_row(Clock::time_point t0, int rows) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rows;
}

// The scalar reference: softmax weights in double, then a linear draw.
int32_t scalar_reference(const std::vector<float>& logits, double inv_t, double u01) {
  float max_logit = logits[0];
  for (float l : logits) {
    max_logit = l > max_logit ? l : max_logit;
  }
  std::vector<double> w(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    w[i] = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t);
    total += w[i];
  }
  const double u = u01 * total;
  double cumulative = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    cumulative += w[i];
    if (u < cumulative) {
      return static_cast<int32_t>(i);
    }
  }
  return static_cast<int32_t>(w.size()) - 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int vocab = argc > 2 ? std::atoi(argv[2]) : 151936;
  if (rows < 1 || vocab < 2) {
    std::fprintf(stderr, "usage: sampler_bench [rows >= 1] [vocab >= 2]\n");
    return 2;
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& l : logits) {
    l = normal(gen);
  }
  crescent::engine::Sampler sampler;
  crescent::engine::Rng rng(7);
  crescent::engine::SamplingParams params;
  params.temperature = 1.0f;
  int64_t sink = 0;

  // The floor: sixteen independent sums, so the compiler vectorises the read.
  auto t0 = Clock::now();
  float lanes[16] = {};
  for (int r = 0; r < rows; ++r) {
    size_t i = 0;
    for (; i + 16 <= logits.size(); i += 16) {
      for (size_t j = 0; j < 16; ++j) {
        lanes[j] += logits[i + j];
      }
    }
  }
  const double read_us = micros_per_row(t0, rows);
  float read_sum = 0;
  for (float l : lanes) {
    read_sum += l;
  }

  t0 = Clock::now();
  for (int r = 0; r < rows; ++r) {
    sink += sampler.sample(logits, params, rng, nullptr);
  }
  const double sample_us = micros_per_row(t0, rows);

  params.temperature = 0.0f;
  t0 = Clock::now();
  for (int r = 0; r < rows; ++r) {
    sink += sampler.sample(logits, params, rng, nullptr);
  }
  const double greedy_us = micros_per_row(t0, rows);

  const int reference_rows = std::max(1, rows / 10);  // it is slow
  t0 = Clock::now();
  for (int r = 0; r < reference_rows; ++r) {
    sink += scalar_reference(logits, 1.0, rng.next_double());
  }
  const double reference_us = micros_per_row(t0, reference_rows);

  std::printf("sampler_bench: vocab %d, %d rows (%d for the scalar reference)\n", vocab, rows,
              reference_rows);
  std::printf("  %-44s %9.1f us/row\n", "one read pass over the row (floor)", read_us);
  std::printf("  %-44s %9.1f us/row  %5.1fx the floor\n", "greedy (temperature 0)", greedy_us,
              greedy_us / read_us);
  std::printf("  %-44s %9.1f us/row  %5.1fx the floor\n", "temperature 1, every token", sample_us,
              sample_us / read_us);
  std::printf("  %-44s %9.1f us/row  %5.1fx the floor\n", "scalar reference (double exp per token)",
              reference_us, reference_us / read_us);
  std::printf("  temperature 1 vs the scalar reference: %.1fx faster\n", reference_us / sample_us);
  std::printf("  (checksum %lld %.1f)\n", static_cast<long long>(sink), read_sum);
  return 0;
}
