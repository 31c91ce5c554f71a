#pragma once
// FNV-1a, 64-bit: a small hash that is the same on every host and build, for weight
// fingerprints, compatibility checks, prompt checks and routing keys, where a collision costs
// a refused connection or a cache miss. Not a defence against chosen inputs.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace crescent {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;

  Fnv1a64& byte(uint8_t b) {
    h_ = (h_ ^ b) * kPrime;
    return *this;
  }
  Fnv1a64& bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i)
      byte(p[i]);
    return *this;
  }
  Fnv1a64& text(std::string_view s) { return bytes(s.data(), s.size()); }
  // Folds a whole 64-bit word in one step (not byte-wise FNV-1a): a cheap separator or
  // counter between byte runs.
  Fnv1a64& word(uint64_t w) {
    h_ = (h_ ^ w) * kPrime;
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kOffsetBasis;
};

inline uint64_t fnv1a64(std::string_view s) {
  return Fnv1a64().text(s).value();
}

}  // namespace crescent
