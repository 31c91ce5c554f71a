#pragma once
// Monotonic time and deadlines. Every wait in crescent takes a Deadline, never "forever".

#include <chrono>
#include <cstdint>

namespace crescent {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// Seconds from t0 to now.
inline double seconds_since(TimePoint t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A point in time after which a wait gives up. Deadline::never() exists for tests and for
// loops that are woken explicitly; production waits use after().
class Deadline {
 public:
  static Deadline after(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline after_ms(int64_t ms) { return after(std::chrono::milliseconds(ms)); }
  static Deadline never() { return Deadline(TimePoint::max()); }

  TimePoint when() const { return when_; }
  bool is_expired() const { return Clock::now() >= when_; }
  std::chrono::nanoseconds remaining() const {
    auto now = Clock::now();
    return now >= when_ ? std::chrono::nanoseconds(0) : when_ - now;
  }
  int64_t remaining_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(remaining()).count();
  }

 private:
  explicit Deadline(TimePoint when) : when_(when) {}
  TimePoint when_;
};

}  // namespace crescent
