#pragma once
// Strong integer ids (BlockId, RequestId, ...) so that one kind of id can never be passed
// where another is expected, and random identifiers (uuid v4 text) for wire-level ids.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace crescent {

template <typename Tag, typename Int = int64_t>
class StrongId {
 public:
  using value_type = Int;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Int v) : value_(v) {}
  constexpr Int value() const { return value_; }
  constexpr bool is_valid() const { return value_ >= 0; }
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  friend std::ostream& operator<<(std::ostream& os, StrongId id) { return os << id.value_; }

 private:
  Int value_ = -1;
};

// A random RFC 4122 version-4 uuid, e.g. "3f2b...-...". Thread-safe.
std::string random_uuid();
// A random 64-bit value from a per-thread generator seeded from std::random_device.
uint64_t random_u64();

}  // namespace crescent

template <typename Tag, typename Int>
struct std::hash<crescent::StrongId<Tag, Int>> {
  size_t operator()(crescent::StrongId<Tag, Int> id) const noexcept {
    return std::hash<Int>()(id.value());
  }
};
