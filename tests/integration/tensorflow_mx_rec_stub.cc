// A stand-in for Rec SDK's (mx_rec's) own op library, for tests/integration/test_tensorflow.py:
// the op LazyAdam with mx_rec's signature and a CPU kernel that, like mx_rec's, updates nothing
// (it returns its inputs), registered with the default priority. Loaded together with fusekit's
// library, fusekit's kernel (priority 10) must be the one that runs, in either load order.
#define EIGEN_USE_THREADS  // TensorFlow's CPU device is Eigen's thread-pool device

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

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
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->input(2 + i));
      return absl::OkStatus();
    });

class StubLazyAdamOp : public tensorflow::OpKernel {
 public:
  explicit StubLazyAdamOp(tensorflow::OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(tensorflow::OpKernelContext *ctx) override {
    for (int i = 0; i < 3; ++i) ctx->set_output(i, ctx->input(2 + i));
  }
};

REGISTER_KERNEL_BUILDER(Name("LazyAdam").Device(tensorflow::DEVICE_CPU), StubLazyAdamOp);

}  // namespace
