// fusekit internal: the seam between an operator's plan and its implementations.
//
// What an implementation (common/plan.h) gets for a run, and the helpers every operator's
// problem and implementations share: the workspace, the per-run scalar tensors, the check of the
// tensors bound to a run by role.
#ifndef FUSEKIT_COMMON_IMPLEMENTATION_H_
#define FUSEKIT_COMMON_IMPLEMENTATION_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/device.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

inline constexpr size_t kWorkspaceAlign = 64;
inline constexpr const char *kReferenceName = "cpu_reference";

inline size_t align_up(size_t n, size_t a = kWorkspaceAlign) {
  return (n + a - 1) / a * a;
}

// What a run gets besides its problem and tensors.
struct RunContext {
  char *workspace = nullptr;  // 64-byte aligned; workspace_bytes() of the implementation
  size_t workspace_size = 0;
  int threads = 1;
  StreamHandle stream = nullptr;
  StageTimer *timer = nullptr;  // never null inside run()
};

// The workspace a run was given: big enough, present when needed, then aligned.
inline Status aligned_workspace(const char *op, void *workspace, size_t size, size_t needed,
                                char **out) {
  if (size < needed) {
    return Status::Invalid(str_cat(op, ": workspace of ", size, " bytes, ", needed, " needed"));
  }
  if (needed > 0 && workspace == nullptr)
    return Status::NullPointer(str_cat(op, ": workspace is null"));
  const auto p = reinterpret_cast<uintptr_t>(workspace);
  *out = reinterpret_cast<char *>((p + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
  return Status::Ok();
}

// The context of one run: the caller's workspace (checked and aligned as above, `needed` bytes of
// it the implementation's), the plan's threads, the stream, the run's stage timer.
inline Status make_run_context(const char *op, void *workspace, size_t size, size_t needed,
                               int threads, StreamHandle stream, StageTimer *timer,
                               RunContext *ctx) {
  FUSEKIT_RETURN_IF_ERROR(aligned_workspace(op, workspace, size, needed, &ctx->workspace));
  ctx->workspace_size = needed;
  ctx->threads = threads;
  ctx->stream = stream;
  ctx->timer = timer;
  return Status::Ok();
}

// For the one-call entry points (a plan made, then run once): `bytes` of workspace allocated for
// the run (none when 0) and freed after it; fn(workspace) runs the plan.
template <class Fn>
Status with_own_workspace(const char *op, size_t bytes, Fn &&fn) {
  std::unique_ptr<char[]> workspace;
  if (bytes > 0) {
    workspace.reset(new (std::nothrow) char[bytes]);
    if (!workspace) {
      return Status::Runtime(str_cat(op, ": could not allocate a workspace of ", bytes, " bytes"));
    }
  }
  return fn(static_cast<void *>(workspace.get()));
}

// A per-step scalar given as a tensor (the aclnn face's lr and step): one element of `dtype` on
// the cpu, read now, at any alignment. Leaves *value alone when `tensor` is empty.
template <typename T>
Status read_scalar_tensor(const char *op, const char *name, const TensorView &tensor, DType dtype,
                          T *value) {
  if (tensor.empty_view()) return Status::Ok();
  if (tensor.dtype != dtype || tensor.numel() != 1 || tensor.data == nullptr ||
      tensor.device != Device::kCpu) {
    return Status::Invalid(str_cat(op, ": ", name, " must be one ", dtype_name(dtype),
                                   " element on the cpu, got ", dtype_name(tensor.dtype), " ",
                                   tensor.shape_string()));
  }
  std::memcpy(value, tensor.data, sizeof(T));
  return Status::Ok();
}

// A CPU implementation's learning rate: `lr`, or the one float32 element of `lr_tensor` where that
// is set (read on the host, now); refused when it is not finite.
inline Status host_lr(const char *op, float lr, const TensorView &lr_tensor, float *out) {
  FUSEKIT_RETURN_IF_ERROR(read_scalar_tensor(op, "lr", lr_tensor, DType::kFloat32, &lr));
  if (!std::isfinite(lr)) {
    return Status::Invalid(str_cat(op, ": lr = ", lr, " is not finite; nothing was modified"));
  }
  *out = lr;
  return Status::Ok();
}

// One tensor of an operator, as its problem's check() sees it: the name the messages use (the aclnn
// face's), whether the operator writes it, whether its data is read even when the run updates
// nothing (an 8-bit optimizer's maps), and whether the aclnn face takes a null tensor for it (an
// empty view). An operator lists its roles once, in the order of its Tensors struct: the problem
// check (check_bound_tensors), the aclnn face and the seam tests read them.
struct TensorRole {
  const char *name;
  bool written = false;
  bool read_when_empty = false;
  bool optional = false;
};

// The check of the tensors bound to a run, role by role: the planned layout and an aligned data
// pointer (check_binding), data present (where the tensor has elements or is read when empty),
// and no memory shared between a written tensor and any other (the written ones first, each
// against those after it, then against the inputs: "A and B overlap in memory").
Status check_bound_tensors(const char *op, std::span<const TensorRole> roles,
                           std::span<const TensorView *const> planned,
                           std::span<const TensorView *const> bound);

// Whether two descriptions have the same dtype, device, shape and strides (strides of size-1
// dimensions are not compared). Data pointers are not looked at.
bool same_layout(const TensorView &a, const TensorView &b);
// Ok when `bound` has the planned layout and a data pointer aligned to its element size (or
// null; each operator checks presence itself); else kInvalidArgument naming the tensor and both
// layouts, or the misaligned address.
Status check_binding(const char *op, const char *name, const TensorView &planned,
                     const TensorView &bound);

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_IMPLEMENTATION_H_
