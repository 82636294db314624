// fusekit: LazyAdam, one Adam step on the embedding rows a batch touched.
//
//   for each distinct row r named by indices (negative indices are padding and are skipped):
//     g   = sum of the gradient rows whose index is r, in order of occurrence
//     m   = m * beta1 + g * (1 - beta1)
//     v   = |v * beta2 + (g * g) * (1 - beta2)|
//     var = var + (m * -lr) / (sqrt(v) + epsilon)
//
// All in float32, in exactly this order (Rec SDK's kernel and golden script); no bias correction
// inside: pass lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t). A row whose summed gradient holds
// NaN or Inf is left unchanged and counted. See docs/lazy_adam.md.
//
// A LazyAdamProblem (shapes, dtypes, attributes) is validated once; LazyAdam::plan() picks an
// implementation and sizes the workspace; run() binds the tensors and lr of one step, checks the
// data (the indices, lr) before writing anything, then updates in place. A plan is reused for any
// number of steps.
#ifndef FUSEKIT_LAZY_ADAM_H_
#define FUSEKIT_LAZY_ADAM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/device.h"
#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/plan_state.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

struct LazyAdamOptions {
  // The attributes as the aclnn call takes them (doubles, converted to float32 when planned).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-7;
  KernelChoice kernel = KernelChoice::kAuto;
  const char *implementation = nullptr;  // a name from LazyAdam::implementations(), or auto
  int num_threads = 0;                   // 0: fusekit::num_threads() when the plan is made
};

struct LazyAdamStats {
  int64_t rows_updated = 0;            // distinct rows written
  int64_t rows_skipped_nonfinite = 0;  // distinct rows left unchanged: non-finite summed gradient
  int64_t indices_padding = 0;         // negative indices (ignored)
};

// The tensors of one run. gradient: float32 [N, D]; indices: int32 or int64, [N] or [N, 1];
// m, v, var: float32 [R, D], updated in place. Every 2-D tensor needs a contiguous last dimension;
// row strides are free. m, v and var must not share elements with each other or with the inputs.
struct LazyAdamTensors {
  TensorView gradient, indices, m, v, var;
};

// The per-step scalars. When lr_tensor is set (one float32 element), the implementation reads lr
// from it at run time, where it lives, instead of from `lr` (the aclnn face passes its lr tensor).
struct LazyAdamScalars {
  float lr = 0.0f;
  TensorView lr_tensor;
};

// What a plan is made for: shapes, dtypes, strides, devices and attributes. Data pointers are not
// looked at (the descriptions keep them null).
class LazyAdamProblem {
 public:
  // Validates everything that shapes, dtypes, strides and attributes can tell.
  FUSEKIT_API static Status make(const LazyAdamTensors &tensors, const LazyAdamOptions &options,
                                 LazyAdamProblem *out);
  // Checks the tensors bound to a run: the problem's layouts, data present, no forbidden overlap.
  FUSEKIT_API Status check(const LazyAdamTensors &tensors) const;

  LazyAdamTensors desc;
  int64_t n = 0, d = 0, rows = 0;
  float beta1 = 0, beta2 = 0, epsilon = 0;
};

struct LazyAdamOp;  // the operator as the plan layer sees it (src/lazy_adam/lazy_adam_impl.h)

class LazyAdam {
 public:
  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation (the first that supports the problem on this machine, or
  // the one the options ask for) and books its workspace. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const LazyAdamProblem &problem, const LazyAdamOptions &options,
                                 LazyAdam *out);
  // Phase one and a binding in one call: the problem of these tensors, planned, with the tensors
  // kept for run(lr, ...) below.
  FUSEKIT_API static Status plan(const TensorView &gradient, const TensorView &indices,
                                 const TensorView &m, const TensorView &v, const TensorView &var,
                                 const LazyAdamOptions &options, LazyAdam *out);

  // Bytes of scratch memory a run needs (aligned to 64 by the caller or not: run() aligns).
  size_t workspace_size() const { return state_.workspace_bytes; }
  // The implementation the plan runs ("cpu_hwy", "cpu_reference", ...).
  const char *implementation() const { return state_.impl_name; }
  const LazyAdamProblem &problem() const { return state_.problem; }

  // Phase two, any number of times: binds the tensors (checked against the problem: same layouts,
  // data present, no overlap; the pointers may change from run to run) and the scalars, checks
  // every index (an index >= R fails with kInvalidArgument naming the position and value, and
  // nothing is modified) and lr (finite), then runs.
  FUSEKIT_API Status run(const LazyAdamTensors &tensors, const LazyAdamScalars &scalars,
                         void *workspace, size_t workspace_size, LazyAdamStats *stats = nullptr,
                         StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(gradient, ...).
  FUSEKIT_API Status run(float lr, void *workspace, size_t workspace_size,
                         LazyAdamStats *stats = nullptr) const;

  int64_t num_indices() const { return state_.problem.n; }
  int64_t dim() const { return state_.problem.d; }
  int64_t table_rows() const { return state_.problem.rows; }

 private:
  PlanState<LazyAdamOp, LazyAdamProblem, LazyAdamTensors> state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status lazy_adam_step(const TensorView &gradient, const TensorView &indices,
                                  const TensorView &m, const TensorView &v, const TensorView &var,
                                  float lr, const LazyAdamOptions &options = {},
                                  LazyAdamStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_H_
