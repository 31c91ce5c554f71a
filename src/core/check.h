#pragma once
// CRESCENT_CHECK(cond) << "context": aborts with file:line and the message when a program
// invariant is broken. For bugs only; run-time failures are Status (status.h).

#include <sstream>

namespace crescent::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & CheckFailure(...) << ...` type-check.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace crescent::internal

#define CRESCENT_CHECK(cond)                 \
  (cond) ? (void)0                           \
         : ::crescent::internal::Voidify() & \
               ::crescent::internal::CheckFailure(__FILE__, __LINE__, #cond)

#define CRESCENT_CHECK_EQ(a, b) CRESCENT_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define CRESCENT_CHECK_NE(a, b) CRESCENT_CHECK((a) != (b)) << (a) << " vs " << (b) << " "
#define CRESCENT_CHECK_LT(a, b) CRESCENT_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
#define CRESCENT_CHECK_LE(a, b) CRESCENT_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
#define CRESCENT_CHECK_GE(a, b) CRESCENT_CHECK((a) >= (b)) << (a) << " vs " << (b) << " "
