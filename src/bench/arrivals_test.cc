// Arrival times follow the requested rate and burstiness: with a fixed seed, the gaps of a long
// schedule have the mean 1/rate exactly (vLLM rescales the total), the coefficient of
// variation 1/sqrt(burstiness) of a gamma distribution, and for burstiness 1 the
// exponential distribution (Kolmogorov-Smirnov test).

#include "bench/arrivals.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace crescent::bench {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> gaps_of(const std::vector<double>& offsets) {
  std::vector<double> gaps;
  double prev = 0;
  for (double t : offsets) {
    gaps.push_back(t - prev);
    prev = t;
  }
  return gaps;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) {
    s += x;
  }
  return s / static_cast<double>(v.size());
}

double cv_of(const std::vector<double>& v) {
  double m = mean_of(v);
  double ss = 0;
  for (double x : v) {
    ss += (x - m) * (x - m);
  }
  return std::sqrt(ss / static_cast<double>(v.size())) / m;
}

std::vector<double> schedule(int64_t n, double rate, double burstiness, uint64_t seed) {
  auto r = arrival_offsets_s(n, {rate, burstiness, seed});
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::vector<double>{};
}

TEST(ArrivalsTest, InfiniteRateSendsEverythingAtOnce) {
  auto offsets = schedule(5, kInf, 1, 0);
  EXPECT_EQ(offsets, std::vector<double>(5, 0.0));
}

TEST(ArrivalsTest, LastArrivalIsAtNOverRate) {
  for (double b : {0.5, 1.0, 3.0}) {
    auto offsets = schedule(200, 2.0, b, 11);
    ASSERT_EQ(offsets.size(), 200u);
    EXPECT_NEAR(offsets.back(), 100.0, 1e-9);
    EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
    EXPECT_GT(offsets.front(), 0);  // the first request waits one gap too, as in vLLM
  }
}

TEST(ArrivalsTest, PoissonGapsAreExponential) {
  const int64_t n = 20000;
  const double rate = 10;
  auto gaps = gaps_of(schedule(n, rate, 1.0, 1234));
  EXPECT_NEAR(mean_of(gaps), 1 / rate, 1e-9);
  EXPECT_NEAR(cv_of(gaps), 1.0, 0.03);
  // Kolmogorov-Smirnov against Exp(rate): D below the 1% critical value 1.63 / sqrt(n).
  std::sort(gaps.begin(), gaps.end());
  double d = 0;
  for (size_t i = 0; i < gaps.size(); ++i) {
    double cdf = 1 - std::exp(-rate * gaps[i]);
    d = std::max({d, std::abs(cdf - static_cast<double>(i) / n),
                  std::abs(cdf - static_cast<double>(i + 1) / n)});
  }
  EXPECT_LT(d, 1.63 / std::sqrt(static_cast<double>(n)));
  // Counts per 1 s window are Poisson(10): variance close to the mean.
  auto offsets = schedule(n, rate, 1.0, 1234);
  std::vector<double> counts(static_cast<size_t>(n / rate), 0);
  for (double t : offsets) {
    counts[std::min(counts.size() - 1, static_cast<size_t>(t))] += 1;
  }
  double m = mean_of(counts);
  double cv = cv_of(counts);
  EXPECT_NEAR(m, rate, 1e-9);
  EXPECT_NEAR(cv * cv * m, 1.0, 0.1);  // variance / mean
}

TEST(ArrivalsTest, BurstinessSetsTheGammaShape) {
  const int64_t n = 20000;
  for (double b : {0.25, 0.5, 2.0, 4.0, 16.0}) {
    auto gaps = gaps_of(schedule(n, 5.0, b, 99));
    EXPECT_NEAR(mean_of(gaps), 0.2, 1e-9) << "burstiness " << b;
    double expected_cv = 1 / std::sqrt(b);
    EXPECT_NEAR(cv_of(gaps), expected_cv, 0.05 * expected_cv) << "burstiness " << b;
  }
  // Infinite burstiness: evenly spaced.
  auto gaps = gaps_of(schedule(100, 4.0, kInf, 1));
  for (double g : gaps) {
    EXPECT_NEAR(g, 0.25, 1e-12);
  }
}

TEST(ArrivalsTest, SeedMakesItReproducible) {
  EXPECT_EQ(schedule(50, 3, 1, 7), schedule(50, 3, 1, 7));
  EXPECT_NE(schedule(50, 3, 1, 7), schedule(50, 3, 1, 8));
}

TEST(ArrivalsTest, RefusesBadRateAndBurstiness) {
  EXPECT_EQ(arrival_offsets_s(3, {0, 1, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arrival_offsets_s(3, {-1, 1, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arrival_offsets_s(3, {1, 0, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arrival_offsets_s(3, {std::nan(""), 1, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(arrival_offsets_s(0, {1, 1, 0}).is_ok());
}

}  // namespace
}  // namespace crescent::bench
