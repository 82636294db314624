// fusekit internal: the executor that phase one returns and phase two consumes, and the two
// helpers every aclnn entry point is written with.
//
//   aclnnXxxGetWorkspaceSize(...)  -> validate + plan (C++ API), then finish_phase_one(...)
//   aclnnXxx(ws, size, ex, stream) -> run_phase_two(...)
#ifndef FUSEKIT_RUNTIME_EXECUTOR_H_
#define FUSEKIT_RUNTIME_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "aclnn/acl_meta.h"
#include "fusekit/status.h"

struct aclOpExecutor {
  explicit aclOpExecutor(const char *op) : op_name(op) {}
  virtual ~aclOpExecutor() = default;
  aclOpExecutor(const aclOpExecutor &) = delete;
  aclOpExecutor &operator=(const aclOpExecutor &) = delete;

  virtual uint64_t workspace_size() const = 0;
  // Runs the plan on the stream. A non-empty *warning is recorded for aclGetRecentErrMsg on
  // success.
  virtual fusekit::Status execute(void *workspace, uint64_t workspace_size, aclrtStream stream,
                                  std::string *warning) = 0;

  const char *op_name;
};

namespace fusekit {

// The C++ API's messages start with its own name ("LazyAdam: ..."); on the aclnn path they carry
// the aclnn name ("aclnnLazyAdam: ..."). Returns the status with that prefix.
Status with_aclnn_name(Status status, const char *cpp_op);

// Records the message of a failed status and returns its aclnn code.
aclnnStatus report(const Status &status);

// Ends phase one: on success registers the executor as live and hands it and its workspace size
// to the caller. Executors are tracked in a set of live ones, so that a consumed or destroyed
// executor is refused without reading the memory it was in.
aclnnStatus finish_phase_one(const char *op, const Status &status,
                             std::unique_ptr<aclOpExecutor> executor, uint64_t *workspace_size,
                             aclOpExecutor **out);

// Phase two: checks the workspace and stream, runs the executor and frees it (on failure too).
aclnnStatus run_phase_two(const char *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream);

}  // namespace fusekit

#endif  // FUSEKIT_RUNTIME_EXECUTOR_H_
