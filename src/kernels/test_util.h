#pragma once
// Helpers shared by the kernels tests: the ISAs this CPU can run and deterministic data.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/isa.h"

namespace crescent::kernels::testing {

inline std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (isa <= detected_isa())
      isas.push_back(isa);
  }
  return isas;
}

// Restores the active ISA when a test scope ends.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : saved_(active_isa()) {
    CRESCENT_CHECK(set_active_isa(isa).is_ok()) << isa_name(isa);
  }
  ~ScopedIsa() { CRESCENT_CHECK(set_active_isa(saved_).is_ok()) << isa_name(saved_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa saved_;
};

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v)
    x = dist(rng);
  return v;
}

inline std::vector<std::byte> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out)
    b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

}  // namespace crescent::kernels::testing
