#include "runtime/executor.h"

#include <mutex>
#include <new>
#include <unordered_set>

#include "common/c_entry.h"
#include "common/last_message.h"
#include "common/str_cat.h"
#include "runtime/acl_tensor.h"
#include "runtime/stream.h"

namespace fusekit {
namespace {

std::mutex g_live_mu;
std::unordered_set<const aclOpExecutor *> &live_executors() {
  static auto *s = new std::unordered_set<const aclOpExecutor *>();
  return *s;
}

bool is_live(const aclOpExecutor *e) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return live_executors().count(e) != 0;
}

// Removes e from the live set; false when it was not there.
bool retire(const aclOpExecutor *e) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return live_executors().erase(e) != 0;
}

}  // namespace

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
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live_executors().insert(executor.get());  // may throw bad_alloc: the caller's guard reports it
  }
  *out = executor.release();
  return ACLNN_SUCCESS;
}

aclnnStatus run_phase_two(const char *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream) {
  if (executor == nullptr) return report(Status::NullPointer(str_cat(op, ": executor is null")));
  if (!is_live(executor)) {
    return report(Status::Invalid(str_cat(op, ": executor is not a live executor (already run?)")));
  }
  if (std::string(executor->op_name) != op) {  // not ours: it stays live for its own phase two
    return report(Status::Invalid(
        str_cat(op, ": executor was made by ", executor->op_name, "GetWorkspaceSize")));
  }
  // From here on the executor is consumed, whatever happens.
  retire(executor);
  std::unique_ptr<aclOpExecutor> owned(executor);
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

Status phase_one_views(const char *op, std::initializer_list<TensorArg> tensors,
                       const uint64_t *workspace_size, aclOpExecutor *const *executor) {
  for (const TensorArg &a : tensors) {
    FUSEKIT_RETURN_IF_ERROR(view_of(a.tensor, op, a.name, a.view, a.optional));
  }
  if (workspace_size == nullptr) return Status::NullPointer(str_cat(op, ": workspaceSize is null"));
  if (executor == nullptr) return Status::NullPointer(str_cat(op, ": executor is null"));
  return Status::Ok();
}

Status check_scalar_tensor(
    const char *op, const char *name, const TensorView &scalar, DType dtype, int ndim,
    std::initializer_list<std::pair<const TensorView *, const char *>> written) {
  if (scalar.dtype != dtype || scalar.numel() != 1 || (ndim > 0 && scalar.ndim != ndim)) {
    std::string want = str_cat("one ", dtype_name(dtype), " element");  // "int64 [1]" by rank
    if (ndim > 0) {
      want = str_cat(dtype_name(dtype), " [1");
      for (int d = 1; d < ndim; ++d) want += ", 1";
      want += "]";
    }
    return Status::Invalid(str_cat(op, ": ", name, " must be ", want, ", got ",
                                   dtype_name(scalar.dtype), " ", scalar.shape_string()));
  }
  if (scalar.data == nullptr) return Status::NullPointer(str_cat(op, ": ", name, " has no data"));
  for (const auto &[t, tname] : written) {
    if (t->overlaps(scalar)) {
      return Status::Invalid(str_cat(op, ": ", name, " and ", tname, " overlap in memory"));
    }
  }
  return Status::Ok();
}

}  // namespace fusekit

extern "C" aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
  return fusekit::guard_c_entry("aclDestroyAclOpExecutor", ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    if (executor == nullptr) return ACLNN_SUCCESS;
    if (!fusekit::retire(executor)) {
      fusekit::set_last_message("aclDestroyAclOpExecutor: not a live executor");
      return ACLNN_ERR_PARAM_INVALID;
    }
    delete executor;
    return ACLNN_SUCCESS;
  });
}
