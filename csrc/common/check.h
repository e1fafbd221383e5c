// Internal: how host checks report a failed precondition. Shared by the generic validation
// (csrc/common/validate.cpp) and the backends' supports() functions, so every message reads
// "op: field = value: requirement".
#pragma once

#include <cstdint>
#include <string>

#include "flashdsa/status.h"

namespace flashdsa::detail {

// The op being checked (the message prefix).
struct Check {
  const char* op;

  // kInvalidArgument "op: field = value: requirement".
  Status fail(const std::string& field, const std::string& value, const std::string& requirement) const {
    return Status::InvalidArgument(std::string(op) + ": " + field + " = " + value + ": " + requirement);
  }
  Status fail(const std::string& field, int64_t value, const std::string& requirement) const {
    return fail(field, std::to_string(value), requirement);
  }
  // kNotSupported "op: what" (valid input this backend cannot run).
  Status unsupported(const std::string& what) const { return Status::NotSupported(std::string(op) + ": " + what); }
};

}  // namespace flashdsa::detail
