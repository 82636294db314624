// fusekit.tensorflow's op library, the 8-bit op: FusekitResourceSparseApplyLazyAdamQuant, fusekit's
// LazyAdamQuant (LazyAdam with m and v kept as uint8 codes and a float32 absmax per row and block
// of 256 columns, fusekit/lazy_adam_quant.h) on resource variables. docs/tensorflow.md.
//
// Its state format is an attribute (docs/fp8_state.md): state_format "dynamic_map" (the default:
// codes into qmap_m and qmap_v) or "fp8" (m as E4M3, sqrt(v) as UE4M4: the maps are unused and
// must be empty, 0 elements; the absmax variable holds the blocks' scales), and guard_lost_v, the
// lost-v guard of the dynamic-map format (default off, as the C++ face; always on in fp8). The
// packed layout below is the same in both formats.
//
// The state of a table [rows, dim] is two variables, packed by row as fusekit.torch's
// SparseAdam8bit packs it: `codes` uint8 [rows, 2, dim] (m's codes, then v's, side by side) and
// `absmax` float32 [rows, 2, ceil(dim / 256)]: a step then touches one cache line of codes and one
// of absmax per row at dim <= 32 instead of two each (45 against 55 ms at the seed shape in C++,
// lazy_adam_quant_bench). The kernel sees m and v as strided views of them.
//
// The three variables are locked exclusively in address order, and a variable whose buffer a live
// read shares is copied before the update (copy-on-write, as TensorFlow's dense applies; one in
// copy-on-read mode is updated in place, its reads copy): the FusekitResourceSparseApplyLazyAdam
// op's copy_on_read=False mode, the one Keras needs (its Embedding reads the whole table every
// step). Everything is checked before anything is written: the variables' dtypes and shapes here,
// then both maps and every index by fusekit (an index >= rows fails naming its position and
// value); a refusal becomes InvalidArgumentError.
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
    .Input("codes: resource")
    .Input("absmax: resource")
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
    .Attr("state_format: {'dynamic_map', 'fp8'} = 'dynamic_map'")
    .Attr("guard_lost_v: bool = false")
    .SetShapeFn([](InferenceContext *c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));  // the maps ([0] in fp8)
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &unused));
      return fusekit_tf::sparse_apply_step_shapes(c, 5);
    })
    .Doc(R"doc(
fusekit's LazyAdamQuant on resource variables: var (float32 [rows, dim]) and its 8-bit state,
codes (uint8 [rows, 2, dim]: m's codes into qmap_m, then v's into qmap_v, float32 [256]) and
absmax (float32 [rows, 2, ceil(dim / 256)]: m's, then v's), on the rows named by indices
(duplicates summed, negative ones skipped, an index >= rows refused before anything is written).
lr is the bias-corrected step. The variables are locked exclusively; a buffer a live read shares
is copied first. huge_pages: advise each table of at least 2 MiB onto huge pages once, in place.
state_format: "dynamic_map", or "fp8" (m's codes E4M3, v's codes UE4M4 of sqrt(v), absmax holds
the blocks' scales; qmap_m and qmap_v must be empty). guard_lost_v: where the old v decodes to 0
and the old m does not, take v as m * m (always on in fp8).
)doc");

class ResourceSparseApplyLazyAdamQuantOp : public OpKernel {
 public:
  explicit ResourceSparseApplyLazyAdamQuantOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    float beta1 = 0, beta2 = 0, epsilon = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &beta1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &beta2));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("huge_pages", &huge_pages_enabled_));
    std::string state_format;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("state_format", &state_format));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("guard_lost_v", &options_.guard_lost_v));
    options_.state_format = state_format == "fp8" ? fusekit::QuantStateFormat::kFp8
                                                  : fusekit::QuantStateFormat::kDynamicMap;
    options_.beta1 = beta1;
    options_.beta2 = beta2;
    options_.epsilon = epsilon;
  }

  void Compute(OpKernelContext *ctx) override {
    static constexpr const char *kNames[3] = {"var", "codes", "absmax"};
    static constexpr tensorflow::DataType kTypes[3] = {tensorflow::DT_FLOAT, tensorflow::DT_UINT8,
                                                       tensorflow::DT_FLOAT};
    for (int i = 0; i < 3; ++i)
      OP_REQUIRES_OK(ctx, fusekit_tf::check_variable(ctx, kOp, i, kNames[i], kTypes[i]));
    const Tensor &lr = ctx->input(5);
    OP_REQUIRES(ctx, lr.NumElements() == 1,
                absl::InvalidArgumentError(std::string(kOp) + ": lr must be a scalar, got shape " +
                                           lr.shape().DebugString()));
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        ctx, /*do_lock=*/true, /*sparse=*/false, {0, 1, 2});
    Tensor tables[3];  // var, codes, absmax
    OP_REQUIRES_OK(ctx, fusekit_tf::variable_tensor<float>(ctx, 0, true, &tables[0]));
    OP_REQUIRES_OK(ctx, fusekit_tf::variable_tensor<uint8_t>(ctx, 1, true, &tables[1]));
    OP_REQUIRES_OK(ctx, fusekit_tf::variable_tensor<float>(ctx, 2, true, &tables[2]));
    const Tensor &var = tables[0], &codes = tables[1], &absmax = tables[2];
    OP_REQUIRES(ctx, var.dims() == 2,
                absl::InvalidArgumentError(std::string(kOp) +
                                           ": var must be a 2-D table [rows, dim], got shape " +
                                           var.shape().DebugString()));
    const int64_t rows = var.dim_size(0), dim = var.dim_size(1);
    const int64_t blocks =
        (dim + fusekit::kLazyAdamQuantBlockSize - 1) / fusekit::kLazyAdamQuantBlockSize;
    const auto packed = [&](const Tensor &t, int64_t cols) {
      return t.dims() == 3 && t.dim_size(0) == rows && t.dim_size(1) == 2 && t.dim_size(2) == cols;
    };
    OP_REQUIRES(ctx, packed(codes, dim) && packed(absmax, blocks),
                absl::InvalidArgumentError(
                    std::string(kOp) + ": for var " + var.shape().DebugString() +
                    ", codes must be [" + std::to_string(rows) + ", 2, " + std::to_string(dim) +
                    "] and absmax [" + std::to_string(rows) + ", 2, " + std::to_string(blocks) +
                    "] (m's, then v's, per row; ceil(dim / 256) blocks), got codes " +
                    codes.shape().DebugString() + " and absmax " + absmax.shape().DebugString()));
    if (huge_pages_enabled_) {
      for (const Tensor &t : tables) huge_pages_.advise(t);
    }
    // m and v: strided views of the packed state (row stride 2 dim, resp. 2 blocks).
    auto *code_data = rows == 0 ? nullptr : const_cast<char *>(codes.tensor_data().data());
    auto *absmax_data =
        rows == 0 ? nullptr
                  : reinterpret_cast<float *>(const_cast<char *>(absmax.tensor_data().data()));
    const auto half = [&](void *data, fusekit::DType dtype, int64_t cols) {
      return fusekit::TensorView::strided(data, dtype, {rows, cols}, {2 * cols, 1});
    };
    const Tensor &indices = ctx->input(7);
    const fusekit::DType index_type =
        indices.dtype() == tensorflow::DT_INT64 ? fusekit::DType::kInt64 : fusekit::DType::kInt32;
    const fusekit::LazyAdamQuantTensors t{
        view_of(ctx->input(6), fusekit::DType::kFloat32),
        view_of(indices, index_type),
        half(code_data, fusekit::DType::kUInt8, dim),
        half(code_data == nullptr ? nullptr : code_data + dim, fusekit::DType::kUInt8, dim),
        view_of(var, fusekit::DType::kFloat32),
        view_of(ctx->input(3), fusekit::DType::kFloat32),
        view_of(ctx->input(4), fusekit::DType::kFloat32),
        half(absmax_data, fusekit::DType::kFloat32, blocks),
        half(absmax_data == nullptr ? nullptr : absmax_data + blocks, fusekit::DType::kFloat32,
             blocks)};
    fusekit::LazyAdamQuantProblem problem;
    OP_REQUIRES_OK(ctx,
                   fusekit_tf::to_tf(fusekit::LazyAdamQuantProblem::make(t, options_, &problem)));
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

FUSEKIT_TF_CPU_KERNEL_BY_INDEX_TYPE("FusekitResourceSparseApplyLazyAdamQuant",
                                    ResourceSparseApplyLazyAdamQuantOp);

}  // namespace
