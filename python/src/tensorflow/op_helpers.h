// fusekit.tensorflow's op library, what its ops share: TensorFlow tensors as fusekit views,
// fusekit's status as TensorFlow's, the tables advised onto huge pages once, and the resource
// variables of a sparse apply (checked, locked in address order, copied only where a live read
// shares a buffer). Header-only, for the op sources of this folder (lazy_adam_ops.cc,
// lazy_adam_quant_ops.cc), which are built into one library.
#ifndef FUSEKIT_PYTHON_SRC_TENSORFLOW_OP_HELPERS_H_
#define FUSEKIT_PYTHON_SRC_TENSORFLOW_OP_HELPERS_H_

#define EIGEN_USE_THREADS  // TensorFlow's CPU device is Eigen's thread-pool device

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fusekit/memory.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace fusekit_tf {

using CPUDevice = Eigen::ThreadPoolDevice;

// A TensorFlow tensor as a fusekit view (its dims, row-major contiguous).
inline fusekit::TensorView view_of(const tensorflow::Tensor &t, fusekit::DType dtype) {
  int64_t shape[fusekit::TensorView::kMaxDims] = {};
  const int ndim = t.dims();
  for (int i = 0; i < ndim && i < fusekit::TensorView::kMaxDims; ++i) shape[i] = t.dim_size(i);
  void *data = t.NumElements() == 0 ? nullptr : const_cast<char *>(t.tensor_data().data());
  return fusekit::TensorView::contiguous(data, dtype, shape, ndim);
}

inline absl::Status to_tf(const fusekit::Status &s) {
  if (s.ok()) return absl::OkStatus();
  if (s.code() == fusekit::StatusCode::kNoImplementation)
    return absl::UnimplementedError(s.message());
  if (s.code() == fusekit::StatusCode::kRuntimeError) return absl::InternalError(s.message());
  return absl::InvalidArgumentError(s.message());
}

// Scratch memory of `bytes` from TensorFlow's allocator (null for none), kept alive by *holder.
inline absl::Status workspace(tensorflow::OpKernelContext *ctx, size_t bytes,
                              tensorflow::Tensor *holder, void **out) {
  *out = nullptr;
  if (bytes == 0) return absl::OkStatus();
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      tensorflow::DT_INT8, tensorflow::TensorShape({static_cast<int64_t>(bytes)}), holder));
  *out = const_cast<char *>(holder->tensor_data().data());
  return absl::OkStatus();
}

// The tables on huge pages, where they are: TensorFlow's allocator gives 4 KiB pages (with
// transparent_hugepage "madvise", Debian's default), and a step at random rows is faster on 2 MiB
// pages (44 -> 36 ms at the seed shape here). Each table buffer of at least 2 MiB is advised once
// (fusekit::advise_huge_pages_in_place: MADV_HUGEPAGE and MADV_COLLAPSE; nothing moves, the values
// stay), remembered by address and size per kernel.
class HugePages {
 public:
  void advise(const tensorflow::Tensor &t) {
    const size_t bytes = t.TotalBytes();
    if (bytes < fusekit::kHugePageBytes) return;
    void *p = const_cast<char *>(t.tensor_data().data());
    std::lock_guard<std::mutex> lock(mu_);
    const std::pair<void *, size_t> key{p, bytes};
    if (std::find(advised_.begin(), advised_.end(), key) != advised_.end()) return;
    if (advised_.size() >= 64) advised_.erase(advised_.begin());  // a table that was copied
    advised_.push_back(key);
    (void)fusekit::advise_huge_pages_in_place(p, bytes);
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<void *, size_t>> advised_;
};

// Resource variable `input` of op `op` (named `name` in messages) holds an initialized tensor of
// `dtype` (read under its lock). Check every variable of an op before locking them: the locking
// helpers of a copy-on-read switch copy a tensor as a given type (another dtype would abort
// TensorFlow there).
inline absl::Status check_variable(tensorflow::OpKernelContext *ctx, const char *op, int input,
                                   const char *name, tensorflow::DataType dtype) {
  tensorflow::core::RefCountPtr<tensorflow::Var> var;
  TF_RETURN_IF_ERROR(
      tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), &var));
  tsl::tf_shared_lock lock(*var->mu());
  if (!var->tensor()->IsInitialized()) {
    return absl::FailedPreconditionError(std::string(op) +
                                         ": attempting to use uninitialized variable " + name);
  }
  if (var->tensor()->dtype() != dtype) {
    const std::string want =
        dtype == tensorflow::DT_FLOAT ? "float32" : tensorflow::DataTypeString(dtype);
    return absl::InvalidArgumentError(std::string(op) + ": " + name + " must be a " + want +
                                      " variable, got " +
                                      tensorflow::DataTypeString(var->tensor()->dtype()));
  }
  return absl::OkStatus();
}

// The tensor of resource variable `input` (of element type T; its lock held) to update in place.
// `copy_on_write`: a buffer that a live read shares is copied first (TensorFlow's dense applies'
// way), unless the variable is in copy-on-read mode (every read copies it: in place is safe).
template <typename T>
absl::Status variable_tensor(tensorflow::OpKernelContext *ctx, int input, bool copy_on_write,
                             tensorflow::Tensor *out) {
  tensorflow::core::RefCountPtr<tensorflow::Var> var;
  TF_RETURN_IF_ERROR(
      tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), &var));
  if (copy_on_write && !var->copy_on_read_mode.load()) {
    TF_RETURN_IF_ERROR(tensorflow::PrepareToUpdateVariable<CPUDevice, T>(
        ctx, var->tensor(), /*copy_on_read_mode=*/false));
  }
  *out = *var->tensor();
  return absl::OkStatus();
}

// The shapes of a sparse apply's per-step inputs, `lr` at input `lr` followed by `grad` and
// `indices`: lr a scalar (rank <= 1), grad [N, dim], indices [N] or [N, 1].
inline absl::Status sparse_apply_step_shapes(tensorflow::shape_inference::InferenceContext *c,
                                             int lr) {
  tensorflow::shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(lr), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(lr + 1), 2, &unused));
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(lr + 2), 1, &unused));
  return c->WithRankAtMost(c->input(lr + 2), 2, &unused);
}

}  // namespace fusekit_tf

// The CPU kernel `Op` of op `name` for both index types (attribute Tindices), at a priority above
// the default (10).
#define FUSEKIT_TF_CPU_KERNEL_BY_INDEX_TYPE(name, Op)                                             \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name(name).Device(tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tindices").Priority(10), \
      Op);                                                                                        \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name(name).Device(tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tindices").Priority(10), \
      Op)

#endif  // FUSEKIT_PYTHON_SRC_TENSORFLOW_OP_HELPERS_H_
