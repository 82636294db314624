// fusekit: a status value that carries its message. Every refusal in the library is one of these;
// nothing throws across the library's boundary and nothing aborts.
#ifndef FUSEKIT_STATUS_H_
#define FUSEKIT_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "fusekit/export.h"

namespace fusekit {

// The numbers are aclnn's, so the C layer passes them through unchanged.
enum class StatusCode : int32_t {
  kOk = 0,
  kNullPointer = 161001,       // ACLNN_ERR_PARAM_NULLPTR
  kInvalidArgument = 161002,   // ACLNN_ERR_PARAM_INVALID
  kRuntimeError = 361001,      // ACLNN_ERR_RUNTIME_ERROR
  kShapeMismatch = 561002,     // ACLNN_ERR_INNER_TILING_ERROR (AddLora's shape relations)
  kNoImplementation = 561003,  // ACLNN_ERR_INNER_FIND_KERNEL_ERROR: a valid problem that no
                               // implementation built into this library serves on this machine
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status NullPointer(std::string m) { return {StatusCode::kNullPointer, std::move(m)}; }
  static Status Invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Runtime(std::string m) { return {StatusCode::kRuntimeError, std::move(m)}; }
  static Status ShapeMismatch(std::string m) { return {StatusCode::kShapeMismatch, std::move(m)}; }
  static Status NoImplementation(std::string m) {
    return {StatusCode::kNoImplementation, std::move(m)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  int32_t raw_code() const { return static_cast<int32_t>(code_); }
  const std::string &message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace fusekit

// Propagates a non-ok Status to the caller.
#define FUSEKIT_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::fusekit::Status fusekit_s_ = (expr);   \
    if (!fusekit_s_.ok()) return fusekit_s_; \
  } while (0)

#endif  // FUSEKIT_STATUS_H_
