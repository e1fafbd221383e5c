// FlashDSA: status type returned by every public entry point.
#pragma once

#include <string>
#include <utility>

namespace flashdsa {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a precondition on shapes, dtypes, ranges or pointers failed
  kNotSupported = 2,     // valid input, but this backend / build does not implement it
  kCudaError = 3,        // a CUDA runtime call or kernel launch failed
  kInternal = 4,         // a bug in FlashDSA
};

const char* status_code_name(StatusCode code);

// A status with a readable message. Cheap to copy when ok().
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
  static Status NotSupported(std::string m) { return Status(StatusCode::kNotSupported, std::move(m)); }
  static Status CudaError(std::string m) { return Status(StatusCode::kCudaError, std::move(m)); }
  static Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: q must be ..." (or "OK").
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace flashdsa
