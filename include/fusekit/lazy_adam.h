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
// Two phases: LazyAdam::plan() validates shapes, dtypes and attributes and sizes the workspace;
// run() checks the data (the indices, lr) before writing anything, then updates in place.
#ifndef FUSEKIT_LAZY_ADAM_H_
#define FUSEKIT_LAZY_ADAM_H_

#include <cstddef>
#include <cstdint>

#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

struct LazyAdamOptions {
  // The attributes as the aclnn call takes them (doubles, converted to float32 when planned).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-7;
  KernelChoice kernel = KernelChoice::kAuto;
  int num_threads = 0;  // 0: fusekit::num_threads() when the plan is made
};

struct LazyAdamStats {
  int64_t rows_updated = 0;            // distinct rows written
  int64_t rows_skipped_nonfinite = 0;  // distinct rows left unchanged: non-finite summed gradient
  int64_t indices_padding = 0;         // negative indices (ignored)
};

class LazyAdam {
 public:
  // Phase one. gradient: float32 [N, D]; indices: int32 or int64, [N] or [N, 1]; m, v, var:
  // float32 [R, D], updated in place. Every 2-D tensor needs a contiguous last dimension; row
  // strides are free. m, v and var must not share elements with each other or with gradient.
  FUSEKIT_API static Status plan(const TensorView &gradient, const TensorView &indices,
                                 const TensorView &m, const TensorView &v, const TensorView &var,
                                 const LazyAdamOptions &options, LazyAdam *out);

  // Bytes of scratch memory run() needs (aligned to 64 by the caller or not: run() aligns).
  size_t workspace_size() const { return workspace_bytes_; }

  // Phase two. Checks every index (an index >= R fails with kInvalidArgument naming the position
  // and value, and nothing is modified) and lr (finite), then runs.
  FUSEKIT_API Status run(float lr, void *workspace, size_t workspace_size,
                         LazyAdamStats *stats = nullptr) const;

  int64_t num_indices() const { return n_; }
  int64_t dim() const { return d_; }
  int64_t table_rows() const { return r_; }

 private:
  TensorView gradient_, indices_, m_, v_, var_;
  int64_t n_ = 0, d_ = 0, r_ = 0;
  int64_t index_stride_ = 1;
  float beta1_ = 0, beta2_ = 0, epsilon_ = 0;
  KernelChoice kernel_ = KernelChoice::kAuto;
  int threads_ = 1;
  size_t workspace_bytes_ = 0;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status lazy_adam_step(const TensorView &gradient, const TensorView &indices,
                                  const TensorView &m, const TensorView &v, const TensorView &var,
                                  float lr, const LazyAdamOptions &options = {},
                                  LazyAdamStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_H_
