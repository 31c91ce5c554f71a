#pragma once
// The system's message for an errno value, for error texts.

#include <string>
#include <system_error>

namespace crescent {

// strerror() may hand back a buffer that another thread's call overwrites (and clang-tidy's
// concurrency-mt-unsafe flags it); the generic error category builds a new string each call.
// Read errno into a local before building the rest of a message: allocations may change it.
inline std::string errno_text(int err) {
  return std::generic_category().message(err);
}

}  // namespace crescent
