// fusekit.tensorflow's op library (_fusekit_tf_ops.so, loaded with tf.load_op_library): fusekit's
// LazyAdam as TensorFlow ops on the CPU. docs/tensorflow.md.
//
// - LazyAdam: Rec SDK's (mx_rec's) op, with exactly its signature. mx_rec calls it on TF1 ref
//   variables, whose values reach the kernel as tensors sharing the variables' buffers, and reads
//   the updates in those buffers: the kernel updates m, v and var in place and returns the same
//   tensors. Its kernel is registered with a priority above the default, so that it wins over
//   mx_rec's own CPU kernel (a stub) when both libraries are loaded.
// - FusekitResourceSparseApplyLazyAdam: the same step on resource variables, with TensorFlow's
//   conventions for sparse applies (ResourceSparseApplyAdam's): `use_locking`, the variables'
//   mutexes taken in address order, and copy-on-read mode. With `copy_on_read` (the default, as
//   TensorFlow's own sparse applies), the variables are switched to copy-on-read mode and updated
//   in place, which is safe because every later dense read copies them. Without it, the variables
//   stay in their mode and a variable whose buffer is shared with a live read is copied before the
//   update (copy-on-write, as TensorFlow's dense applies): no dense read of the table ever copies
//   it, which is what an embedding table read whole by Keras' forward pass needs.
//
// Both run fusekit's LazyAdam (sums duplicate indices, skips negative ones, checks every index
// before writing anything); a refusal becomes InvalidArgumentError with fusekit's message.
#include <cstdint>
#include <string>

#include "fusekit/lazy_adam.h"
#include "op_helpers.h"  // defines EIGEN_USE_THREADS before any TensorFlow header
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace {

using fusekit_tf::CPUDevice;
using fusekit_tf::HugePages;
using fusekit_tf::to_tf;
using fusekit_tf::view_of;
using tensorflow::DT_FLOAT;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

struct Attributes {
  float beta1 = 0, beta2 = 0, epsilon = 0;
};

absl::Status read_attributes(OpKernelConstruction *ctx, Attributes *a) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("beta1", &a->beta1));
  TF_RETURN_IF_ERROR(ctx->GetAttr("beta2", &a->beta2));
  return ctx->GetAttr("epsilon", &a->epsilon);
}

// One LazyAdam step on the given tensors, in place on m, v and var: the shapes and ranks checked
// with TensorFlow's words first, then fusekit's problem, plan and run (which checks the indices
// before writing). The workspace comes from TensorFlow's allocator.
absl::Status lazy_adam(OpKernelContext *ctx, const char *op, const Attributes &a,
                       const Tensor &gradient, const Tensor &indices, const Tensor &m,
                       const Tensor &v, const Tensor &var, const Tensor &lr) {
  if (lr.NumElements() != 1) {
    return absl::InvalidArgumentError(std::string(op) + ": lr must be a scalar, got shape " +
                                      lr.shape().DebugString());
  }
  if (var.dims() != 2) {
    return absl::InvalidArgumentError(std::string(op) +
                                      ": var must be a 2-D table [rows, dim], got shape " +
                                      var.shape().DebugString());
  }
  if (!m.shape().IsSameSize(var.shape()) || !v.shape().IsSameSize(var.shape())) {
    return absl::InvalidArgumentError(std::string(op) + ": m " + m.shape().DebugString() +
                                      " and v " + v.shape().DebugString() +
                                      " must have var's shape " + var.shape().DebugString());
  }
  const bool indices_ok = indices.dims() == 1 || (indices.dims() == 2 && indices.dim_size(1) == 1);
  if (!indices_ok) {
    return absl::InvalidArgumentError(std::string(op) + ": indices must be [N] or [N, 1], got " +
                                      indices.shape().DebugString());
  }
  if (gradient.dims() != 2 || gradient.dim_size(0) != indices.dim_size(0) ||
      gradient.dim_size(1) != var.dim_size(1)) {
    return absl::InvalidArgumentError(
        std::string(op) + ": gradient must be [N, dim] = [" + std::to_string(indices.dim_size(0)) +
        ", " + std::to_string(var.dim_size(1)) + "] (N from indices " +
        indices.shape().DebugString() + ", dim from var " + var.shape().DebugString() + "), got " +
        gradient.shape().DebugString());
  }
  const fusekit::DType index_type =
      indices.dtype() == tensorflow::DT_INT64 ? fusekit::DType::kInt64 : fusekit::DType::kInt32;
  const fusekit::LazyAdamTensors t{
      view_of(gradient, fusekit::DType::kFloat32), view_of(indices, index_type),
      view_of(m, fusekit::DType::kFloat32), view_of(v, fusekit::DType::kFloat32),
      view_of(var, fusekit::DType::kFloat32)};
  const fusekit::LazyAdamOptions options{.beta1 = a.beta1, .beta2 = a.beta2, .epsilon = a.epsilon};
  fusekit::LazyAdamProblem problem;
  TF_RETURN_IF_ERROR(to_tf(fusekit::LazyAdamProblem::make(t, options, &problem)));
  fusekit::LazyAdam plan;
  TF_RETURN_IF_ERROR(to_tf(fusekit::LazyAdam::plan(problem, options, &plan)));
  Tensor holder;
  void *ws = nullptr;
  TF_RETURN_IF_ERROR(fusekit_tf::workspace(ctx, plan.workspace_size(), &holder, &ws));
  fusekit::LazyAdamScalars scalars;
  scalars.lr = lr.flat<float>()(0);
  return to_tf(plan.run(t, scalars, ws, plan.workspace_size()));
}

// ------------------------------------------------------------------------------------------------
// LazyAdam: mx_rec's op. Outputs are the updated inputs (the same buffers).
// ------------------------------------------------------------------------------------------------
REGISTER_OP("LazyAdam")
    .Input("gradient: float32")
    .Input("indices: int32")
    .Input("input_m: float32")
    .Input("input_v: float32")
    .Input("input_var: float32")
    .Input("lr: float32")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Output("output_m: float32")
    .Output("output_v: float32")
    .Output("output_var: float32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext *c) {
      ShapeHandle table;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &table));
      TF_RETURN_IF_ERROR(c->Merge(table, c->input(2), &table));
      TF_RETURN_IF_ERROR(c->Merge(table, c->input(3), &table));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &unused));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(5), 1, &unused));
      for (int i = 0; i < 3; ++i) c->set_output(i, table);
      return absl::OkStatus();
    })
    .Doc(R"doc(
fusekit's LazyAdam on the rows named by indices, in place on input_m, input_v and input_var (TF1
ref variables, as Rec SDK's mx_rec passes them): duplicate indices summed, negative ones skipped,
an index >= rows refused before anything is written. lr is the bias-corrected step
lr * sqrt(1 - beta2^t) / (1 - beta1^t). The outputs are the updated tables.
)doc");

class LazyAdamOp : public OpKernel {
 public:
  explicit LazyAdamOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, read_attributes(ctx, &attributes_));
  }

  void Compute(OpKernelContext *ctx) override {
    for (int i = 2; i < 5; ++i) huge_pages_.advise(ctx->input(i));
    OP_REQUIRES_OK(ctx, lazy_adam(ctx, "LazyAdam", attributes_, ctx->input(0), ctx->input(1),
                                  ctx->input(2), ctx->input(3), ctx->input(4), ctx->input(5)));
    for (int i = 0; i < 3; ++i) ctx->set_output(i, ctx->input(2 + i));
  }

 private:
  Attributes attributes_;
  HugePages huge_pages_;
};

// mx_rec registers its CPU kernel with the default priority (0).
REGISTER_KERNEL_BUILDER(Name("LazyAdam").Device(tensorflow::DEVICE_CPU).Priority(10), LazyAdamOp);

// ------------------------------------------------------------------------------------------------
// FusekitResourceSparseApplyLazyAdam: resource variables, TensorFlow's sparse-apply conventions.
// ------------------------------------------------------------------------------------------------
REGISTER_OP("FusekitResourceSparseApplyLazyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("lr: float32")
    .Input("grad: float32")
    .Input("indices: Tindices")
    .Attr("Tindices: {int32, int64}")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("use_locking: bool = false")
    .Attr("copy_on_read: bool = true")
    .Attr("huge_pages: bool = true")
    .SetShapeFn([](InferenceContext *c) { return fusekit_tf::sparse_apply_step_shapes(c, 3); })
    .Doc(R"doc(
fusekit's LazyAdam on resource variables var, m and v (float32 [rows, dim]), the rows named by
indices (duplicates summed, negative ones skipped, an index >= rows refused before anything is
written). lr is the bias-corrected step. use_locking: the variables' mutexes held exclusively.
copy_on_read: TensorFlow's sparse-apply convention (the variables switch to copy-on-read mode);
false keeps their mode and copies a variable only when a live read shares its buffer.
huge_pages: advise each table of at least 2 MiB onto huge pages once, in place.
)doc");

class ResourceSparseApplyLazyAdamOp : public OpKernel {
 public:
  explicit ResourceSparseApplyLazyAdamOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, read_attributes(ctx, &attributes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_locking", &use_exclusive_lock_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("copy_on_read", &copy_on_read_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("huge_pages", &huge_pages_enabled_));
  }

  void Compute(OpKernelContext *ctx) override {
    // copy_on_read: ResourceSparseApplyAdam's way: the variables switch to copy-on-read mode and
    // are updated in place under shared locks (exclusive with use_locking); every dense read
    // copies them, so no read shares these buffers. Otherwise: exclusive locks, and a buffer that
    // a live read shares is copied first (copy-on-write, as TensorFlow's dense applies do); a
    // variable already in copy-on-read mode is updated in place.
    // The dtypes first: the locking helpers copy a float table (a variable of another dtype
    // would abort TensorFlow there).
    static constexpr const char *kNames[3] = {"var", "m", "v"};
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, fusekit_tf::check_variable(ctx, "FusekitResourceSparseApplyLazyAdam", i,
                                                     kNames[i], DT_FLOAT));
    }
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        ctx, copy_on_read_ ? use_exclusive_lock_ : true, /*sparse=*/copy_on_read_, {0, 1, 2});
    Tensor tables[3];  // var, m, v
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, fusekit_tf::variable_tensor<float>(ctx, i, !copy_on_read_, &tables[i]));
      if (huge_pages_enabled_) huge_pages_.advise(tables[i]);
    }
    OP_REQUIRES_OK(ctx,
                   lazy_adam(ctx, "FusekitResourceSparseApplyLazyAdam", attributes_, ctx->input(4),
                             ctx->input(5), tables[1], tables[2], tables[0], ctx->input(3)));
  }

 private:
  Attributes attributes_;
  bool use_exclusive_lock_ = false;
  bool copy_on_read_ = true;
  bool huge_pages_enabled_ = true;
  HugePages huge_pages_;
};

FUSEKIT_TF_CPU_KERNEL_BY_INDEX_TYPE("FusekitResourceSparseApplyLazyAdam",
                                    ResourceSparseApplyLazyAdamOp);

}  // namespace
