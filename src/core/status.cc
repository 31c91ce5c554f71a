#include "core/status.h"

namespace crescent {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::to_string() const {
  if (is_ok())
    return "OK";
  return std::string(status_code_name(code())) + ": " + message();
}

Status Status::with_context(std::string_view context) const {
  if (is_ok())
    return *this;
  return Status(code(), std::string(context) + ": " + message());
}

Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
Status not_found(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
Status already_exists(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
Status out_of_range(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
Status deadline_exceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
Status cancelled(std::string m) {
  return {StatusCode::kCancelled, std::move(m)};
}
Status permission_denied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
Status data_loss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
Status unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
Status internal_error(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

}  // namespace crescent
