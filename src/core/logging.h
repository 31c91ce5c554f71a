#pragma once
// Leveled logging to stderr: CRESCENT_LOG(kInfo) << "loaded " << n << " tensors";
// The level comes from set_log_level() or the CRESCENT_LOG_LEVEL environment variable
// (debug|info|warn|error). Thread-safe: each message is written with one call.

#include <sstream>
#include <string_view>

#include "core/status.h"

namespace crescent {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
Result<LogLevel> parse_log_level(std::string_view name);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  template <typename T>
  LogMessage& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace crescent

#define CRESCENT_LOG(level)                                    \
  if (::crescent::LogLevel::level < ::crescent::log_level()) { \
  } else                                                       \
    ::crescent::internal::LogMessage(::crescent::LogLevel::level, __FILE__, __LINE__)
