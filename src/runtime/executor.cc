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

namespace {
aclnnStatus phase_two(const char *op, void *workspace, uint64_t workspace_size,
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
}  // namespace

aclnnStatus run_phase_two(const char *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream) noexcept {
  return guard_c_entry(op, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return phase_two(op, workspace, workspace_size, executor, stream);
  });
}

std::string unchanged_warning(const char *op, int64_t count, const char *what,
                              const char *because) {
  if (count == 0) return {};
  return str_cat(op, ": warning: ", count, " ", what, " were left unchanged because ", because);
}

Status aclnn_views(const char *op, std::span<const TensorRole> roles,
                   std::span<const aclTensor *const> args, std::span<TensorView *const> views,
                   const ScalarTensorArg *scalar, TensorView *scalar_view,
                   const uint64_t *workspace_size, aclOpExecutor *const *executor) {
  for (size_t i = 0; i < roles.size(); ++i) {
    FUSEKIT_RETURN_IF_ERROR(view_of(args[i], op, roles[i].name, views[i], roles[i].optional));
  }
  if (scalar != nullptr) {
    FUSEKIT_RETURN_IF_ERROR(view_of(scalar->tensor, op, scalar->name, scalar_view, false));
  }
  if (workspace_size == nullptr) return Status::NullPointer(str_cat(op, ": workspaceSize is null"));
  if (executor == nullptr) return Status::NullPointer(str_cat(op, ": executor is null"));
  if (scalar == nullptr) return Status::Ok();
  const char *name = scalar->name;
  const DType dtype = scalar->dtype;
  const int ndim = scalar->ndim;
  const TensorView &s = *scalar_view;
  if (s.dtype != dtype || s.numel() != 1 || (ndim > 0 && s.ndim != ndim)) {
    std::string want = str_cat("one ", dtype_name(dtype), " element");  // "int64 [1]" by rank
    if (ndim > 0) {
      want = str_cat(dtype_name(dtype), " [1");
      for (int d = 1; d < ndim; ++d) want += ", 1";
      want += "]";
    }
    return Status::Invalid(str_cat(op, ": ", name, " must be ", want, ", got ", dtype_name(s.dtype),
                                   " ", s.shape_string()));
  }
  if (s.data == nullptr) return Status::NullPointer(str_cat(op, ": ", name, " has no data"));
  for (size_t i = 0; i < roles.size() && !scalar->read_first; ++i) {
    if (roles[i].written && views[i]->overlaps(s)) {
      return Status::Invalid(str_cat(op, ": ", name, " and ", roles[i].name, " overlap in memory"));
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
