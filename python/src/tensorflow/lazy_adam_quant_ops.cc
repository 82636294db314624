// fusekit.tensorflow's op library, the 8-bit op: FusekitResourceSparseApplyLazyAdamQuant, fusekit's
// LazyAdamQuant (LazyAdam with m and v kept as uint8 codes and a float32 absmax per row and block
// of 256 columns, fusekit/lazy_adam_quant.h) on resource variables. docs/tensorflow.md.
//
// The five variables (var, m, v, absmax_m, absmax_v) are locked exclusively in address order, and a
// variable whose buffer a live read shares is copied before the update (copy-on-write, as
// TensorFlow's dense applies; a variable in copy-on-read mode is updated in place, its reads copy):
// the FusekitResourceSparseApplyLazyAdam op's copy_on_read=False mode, the one Keras needs (its
// Embedding reads the whole table every step). Everything is checked before anything is written:
// the variables' dtypes here, then shapes, both maps and every index by fusekit (an index >= rows
// fails naming its position and value); a refusal becomes InvalidArgumentError.
#include <cstdint>
#include <string>

#include "fusekit/lazy_adam_quant.h"
#include "op_helpers.h"  // defines EIGEN_USE_THREADS before any TensorFlow header
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace {

using fusekit_tf::CPUDevice;
using fusekit_tf::view_of;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

constexpr const char *kOp = "FusekitResourceSparseApplyLazyAdamQuant";

REGISTER_OP("FusekitResourceSparseApplyLazyAdamQuant")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("absmax_m: resource")
    .Input("absmax_v: resource")
    .Input("qmap_m: float32")
    .Input("qmap_v: float32")
    .Input("lr: float32")
    .Input("grad: float32")
    .Input("indices: Tindices")
    .Attr("Tindices: {int32, int64}")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("huge_pages: bool = true")
    .SetShapeFn([](InferenceContext *c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(7), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(8), 2, &unused));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(9), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(9), 2, &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
fusekit's LazyAdamQuant on resource variables: var (float32 [rows, dim]), m and v (uint8 codes
[rows, dim] into qmap_m and qmap_v, float32 [256]), absmax_m and absmax_v (float32
[rows, ceil(dim / 256)]), on the rows named by indices (duplicates summed, negative ones skipped,
an index >= rows refused before anything is written). lr is the bias-corrected step. The variables
are locked exclusively; a buffer a live read shares is copied first. huge_pages: advise each
table of at least 2 MiB onto huge pages once, in place.
)doc");

class ResourceSparseApplyLazyAdamQuantOp : public OpKernel {
 public:
  explicit ResourceSparseApplyLazyAdamQuantOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    float beta1 = 0, beta2 = 0, epsilon = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &beta1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &beta2));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("huge_pages", &huge_pages_enabled_));
    options_.beta1 = beta1;
    options_.beta2 = beta2;
    options_.epsilon = epsilon;
  }

  void Compute(OpKernelContext *ctx) override {
    static constexpr const char *kNames[5] = {"var", "m", "v", "absmax_m", "absmax_v"};
    static constexpr tensorflow::DataType kTypes[5] = {
        tensorflow::DT_FLOAT, tensorflow::DT_UINT8, tensorflow::DT_UINT8, tensorflow::DT_FLOAT,
        tensorflow::DT_FLOAT};
    for (int i = 0; i < 5; ++i)
      OP_REQUIRES_OK(ctx, fusekit_tf::check_variable(ctx, kOp, i, kNames[i], kTypes[i]));
    const Tensor &lr = ctx->input(7);
    OP_REQUIRES(ctx, lr.NumElements() == 1,
                absl::InvalidArgumentError(std::string(kOp) + ": lr must be a scalar, got shape " +
                                           lr.shape().DebugString()));
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        ctx, /*do_lock=*/true, /*sparse=*/false, {0, 1, 2, 3, 4});
    Tensor tables[5];
    for (int i = 0; i < 5; ++i) {
      OP_REQUIRES_OK(ctx, kTypes[i] == tensorflow::DT_UINT8
                              ? fusekit_tf::variable_tensor<uint8_t>(ctx, i, true, &tables[i])
                              : fusekit_tf::variable_tensor<float>(ctx, i, true, &tables[i]));
      if (huge_pages_enabled_) huge_pages_.advise(tables[i]);
    }
    const Tensor &indices = ctx->input(9);
    const fusekit::DType index_type =
        indices.dtype() == tensorflow::DT_INT64 ? fusekit::DType::kInt64 : fusekit::DType::kInt32;
    const fusekit::LazyAdamQuantTensors t{
        view_of(ctx->input(8), fusekit::DType::kFloat32),
        view_of(indices, index_type),
        view_of(tables[1], fusekit::DType::kUInt8),
        view_of(tables[2], fusekit::DType::kUInt8),
        view_of(tables[0], fusekit::DType::kFloat32),
        view_of(ctx->input(5), fusekit::DType::kFloat32),
        view_of(ctx->input(6), fusekit::DType::kFloat32),
        view_of(tables[3], fusekit::DType::kFloat32),
        view_of(tables[4], fusekit::DType::kFloat32)};
    fusekit::LazyAdamQuantProblem problem;
    OP_REQUIRES_OK(ctx, fusekit_tf::to_tf(fusekit::LazyAdamQuantProblem::make(t, options_, &problem)));
    fusekit::LazyAdamQuant plan;
    OP_REQUIRES_OK(ctx, fusekit_tf::to_tf(fusekit::LazyAdamQuant::plan(problem, options_, &plan)));
    Tensor holder;
    void *ws = nullptr;
    OP_REQUIRES_OK(ctx, fusekit_tf::workspace(ctx, plan.workspace_size(), &holder, &ws));
    fusekit::LazyAdamQuantScalars scalars;
    scalars.lr = lr.flat<float>()(0);
    OP_REQUIRES_OK(ctx, fusekit_tf::to_tf(plan.run(t, scalars, ws, plan.workspace_size())));
  }

 private:
  fusekit::LazyAdamQuantOptions options_;
  bool huge_pages_enabled_ = true;
  fusekit_tf::HugePages huge_pages_;
};

REGISTER_KERNEL_BUILDER(Name("FusekitResourceSparseApplyLazyAdamQuant")
                            .Device(tensorflow::DEVICE_CPU)
                            .TypeConstraint<int32_t>("Tindices")
                            .Priority(10),
                        ResourceSparseApplyLazyAdamQuantOp);
REGISTER_KERNEL_BUILDER(Name("FusekitResourceSparseApplyLazyAdamQuant")
                            .Device(tensorflow::DEVICE_CPU)
                            .TypeConstraint<int64_t>("Tindices")
                            .Priority(10),
                        ResourceSparseApplyLazyAdamQuantOp);

}  // namespace
