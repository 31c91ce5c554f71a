#pragma once
// Status and Result<T>: how every run-time failure (I/O, parse, lost peer, bad input) is
// reported across module boundaries. OK is cheap (no allocation). A broken invariant is not a
// Status: it is a bug and goes through CRESCENT_CHECK (check.h).

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/check.h"

namespace crescent {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad flag, bad JSON, bad shape)
  kNotFound,            // a named thing does not exist (file, tensor, peer, request)
  kAlreadyExists,       // a conflicting registration
  kOutOfRange,          // an offset/length/position outside what is allowed
  kResourceExhausted,   // no memory, no blocks, too large
  kFailedPrecondition,  // right input, wrong state (not loaded yet, closed)
  kUnavailable,         // a peer or service that may come back (connection refused, 503)
  kDeadlineExceeded,    // a wait ran past its deadline
  kCancelled,           // the caller or a peer gave up
  kPermissionDenied,    // wrong token / secret
  kDataLoss,            // truncated or corrupt file or frame
  kUnimplemented,       // valid but unsupported (architecture, dtype, template)
  kInternal,            // a failure of a dependency we cannot classify better
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status ok() { return Status(); }

  bool is_ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "CODE: message", or "OK".
  std::string to_string() const;
  // Returns a copy whose message is "context: message"; OK stays OK.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};

Status invalid_argument(std::string message);
Status not_found(std::string message);
Status already_exists(std::string message);
Status out_of_range(std::string message);
Status resource_exhausted(std::string message);
Status failed_precondition(std::string message);
Status unavailable(std::string message);
Status deadline_exceeded(std::string message);
Status cancelled(std::string message);
Status permission_denied(std::string message);
Status data_loss(std::string message);
Status unimplemented(std::string message);
Status internal_error(std::string message);

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : data_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    CRESCENT_CHECK(!std::get<Status>(data_).is_ok()) << "Result built from an OK status";
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return is_ok() ? Status() : std::get<Status>(data_); }

  T& value() & {
    check_ok();
    return std::get<T>(data_);
  }
  const T& value() const& {
    check_ok();
    return std::get<T>(data_);
  }
  T&& value() && {
    check_ok();
    return std::get<T>(std::move(data_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check_ok() const {
    CRESCENT_CHECK(is_ok()) << "value() of a failed Result: "
                            << std::get<Status>(data_).to_string();
  }
  std::variant<T, Status> data_;
};

namespace internal {
inline Status to_status(const Status& s) {
  return s;
}
template <typename T>
Status to_status(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace crescent

#define CRESCENT_CONCAT_INNER(a, b) a##b
#define CRESCENT_CONCAT(a, b) CRESCENT_CONCAT_INNER(a, b)

// Returns the Status of `expr` (a Status or Result) from the enclosing function if it failed.
#define RETURN_IF_ERROR(expr)                                                      \
  do {                                                                             \
    ::crescent::Status crescent_status_ = ::crescent::internal::to_status((expr)); \
    if (!crescent_status_.is_ok())                                                 \
      return crescent_status_;                                                     \
  } while (false)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares/assigns x or returns the failure.
#define ASSIGN_OR_RETURN(lhs, expr) \
  CRESCENT_ASSIGN_OR_RETURN_IMPL(CRESCENT_CONCAT(crescent_result_, __LINE__), lhs, expr)
#define CRESCENT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.is_ok())                                    \
    return tmp.status();                               \
  lhs = std::move(tmp).value()
