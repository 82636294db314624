#include "runtime/executor.h"

#include <new>

#include "common/last_message.h"
#include "common/str_cat.h"
#include "runtime/stream.h"

namespace fusekit {

Status with_aclnn_name(Status status, const char *cpp_op) {
  const std::string prefix = std::string(cpp_op) + ":";
  if (status.ok() || status.message().rfind(prefix, 0) != 0) return status;
  return Status(status.code(), "aclnn" + status.message());
}

aclnnStatus report(const Status &status) {
  if (!status.ok()) set_last_message(status.message());
  return status.raw_code();
}

aclnnStatus finish_phase_one(const char *op, const Status &status,
                             std::unique_ptr<aclOpExecutor> executor, uint64_t *workspace_size,
                             aclOpExecutor **out) {
  if (!status.ok()) return report(status);
  if (workspace_size == nullptr || out == nullptr) {
    return report(Status::NullPointer(
        str_cat(op, "GetWorkspaceSize: ", workspace_size == nullptr ? "workspaceSize" : "executor",
                " is null")));
  }
  *workspace_size = executor->workspace_size();
  *out = executor.release();
  return ACLNN_SUCCESS;
}

aclnnStatus run_phase_two(const char *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream) {
  if (executor == nullptr) return report(Status::NullPointer(str_cat(op, ": executor is null")));
  if (executor->magic != aclOpExecutor::kMagic) {
    return report(Status::Invalid(str_cat(op, ": executor is not a live executor (already run?)")));
  }
  // From here on the executor is consumed, whatever happens.
  std::unique_ptr<aclOpExecutor> owned(executor);
  if (std::string(owned->op_name) != op) {
    owned.release();  // not ours to free: it belongs to another operator's phase two
    return report(Status::Invalid(
        str_cat(op, ": executor was made by ", executor->op_name, "GetWorkspaceSize")));
  }
  const uint64_t needed = owned->workspace_size();
  if (workspace_size < needed) {
    return report(Status::Invalid(str_cat(op, ": workspaceSize = ", workspace_size,
                                          " but phase one asked for ", needed, " bytes")));
  }
  if (needed > 0 && workspace == nullptr) {
    return report(Status::NullPointer(
        str_cat(op, ": workspace is null but phase one asked for ", needed, " bytes")));
  }
  if (!stream_is_valid(stream)) {
    return report(Status::Invalid(str_cat(op, ": stream is not a live stream")));
  }
  std::string warning;
  Status st;
  try {
    st = owned->execute(workspace, workspace_size, stream, &warning);
  } catch (const std::bad_alloc &) {
    st = Status::Runtime(str_cat(op, ": out of memory"));
  } catch (...) {
    st = Status::Runtime(str_cat(op, ": internal error"));
  }
  if (st.ok() && !warning.empty()) set_last_message(warning);
  return report(st);
}

}  // namespace fusekit

extern "C" aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
  if (executor == nullptr) return ACLNN_SUCCESS;
  if (executor->magic != aclOpExecutor::kMagic) {
    fusekit::set_last_message("aclDestroyAclOpExecutor: not a live executor");
    return ACLNN_ERR_PARAM_INVALID;
  }
  delete executor;
  return ACLNN_SUCCESS;
}
