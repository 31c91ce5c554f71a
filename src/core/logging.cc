#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace crescent {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("CRESCENT_LOG_LEVEL");
  if (env != nullptr) {
    auto parsed = parse_log_level(env);
    if (parsed.is_ok())
      return *parsed;
  }
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

const char* level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarn:
      return "W";
    case LogLevel::kError:
      return "E";
    case LogLevel::kOff:
      return "-";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) {
  level_storage().store(level);
}
LogLevel log_level() {
  return level_storage().load(std::memory_order_relaxed);
}

Result<LogLevel> parse_log_level(std::string_view name) {
  if (name == "debug")
    return LogLevel::kDebug;
  if (name == "info")
    return LogLevel::kInfo;
  if (name == "warn" || name == "warning")
    return LogLevel::kWarn;
  if (name == "error")
    return LogLevel::kError;
  if (name == "off")
    return LogLevel::kOff;
  return invalid_argument("unknown log level '" + std::string(name) +
                          "' (expected debug, info, warn, error or off)");
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << level_letter(level) << " " << stamp << "." << (millis < 100 ? "0" : "")
          << (millis < 10 ? "0" : "") << millis << " " << (base ? base + 1 : file) << ":" << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string text = stream_.str();
  // One write() so that lines from different threads never interleave.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  (void)level_;
}

}  // namespace internal
}  // namespace crescent
