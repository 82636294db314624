// fusekit: EmbeddingBagLazyAdam, the backward of an embedding bag fused with a LazyAdam step on
// the rows it looked up (FBGEMM's table-batched embedding with the optimizer in the backward, on a
// CPU). No gradient of the table and no per-lookup gradient [L, D] is ever materialized.
//
//   bag b holds the lookups offsets[b] .. offsets[b + 1] - 1 (offsets: [B + 1], TorchRec's form);
//   c_i = s_b * w_i     s_b = 1 (sum) or 1 / float32(len_b) (mean); w_i = per_sample_weights[i]
//                       (weighted) or 1
//   for each distinct row r named by indices:
//     g   = x_{i1} + x_{i2} + ..., x_i = grad_output[b_i] * c_i, over the lookups i of r in
//           occurrence order, left to right (the first term is x_{i1} itself, not 0 + x_{i1})
//     m   = m * beta1 + g * (1 - beta1)
//     v   = |v * beta2 + (g * g) * (1 - beta2)|
//     var = var + (m * -lr) / (sqrt(v) + epsilon)
//
// All in float32, in exactly this order (LazyAdam's step: docs/lazy_adam.md); lr is the
// bias-corrected rate lr * sqrt(1 - beta2^t) / (1 - beta1^t), a per-run scalar. A row whose g holds
// NaN or Inf is left unchanged and counted. Rows no lookup names are never read or written.
// See docs/embedding_bag_lazy_adam.md.
//
// The batch-sized dimensions (B bags, L lookups) are bound per run (XNNPACK's reshape): a problem
// and a plan are made for the table (R, D, dtypes, attributes, pooling, weighted or not) and run
// any batch; workspace_size(tensors) (or workspace_size(B, L)) says what a run of that batch needs.
#ifndef FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_H_
#define FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_H_

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

// How a bag's embeddings were pooled in the forward: their (weighted) sum, or that divided by the
// bag's length.
enum class PoolingMode : int { kSum = 0, kMean = 1 };

struct EmbeddingBagLazyAdamOptions {
  // Converted to float32 when planned: beta1, beta2 in [0, 1), epsilon finite and > 0 (as float32).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  PoolingMode pooling = PoolingMode::kSum;
  KernelChoice kernel = KernelChoice::kAuto;
  const char *implementation = nullptr;  // a name from EmbeddingBagLazyAdam::implementations()
  int num_threads = 0;                   // 0: fusekit::num_threads() when the plan is made
};

struct EmbeddingBagLazyAdamStats {
  int64_t rows_updated = 0;            // distinct rows written
  int64_t rows_skipped_nonfinite = 0;  // distinct rows left unchanged: non-finite gradient
};

// The tensors of one run.
//   grad_output         float32 [B, D], the gradient of the pooled output (row stride free)
//   indices             int32 or int64 [L], rows of the table in [0, R) (negative ids are refused)
//   offsets             int32 or int64 [B + 1]: bag b is indices[offsets[b] .. offsets[b + 1]);
//                       offsets[0] = 0, non-decreasing, offsets[B] = L
//   per_sample_weights  float32 [L], or an empty view (TensorView{}) for an unweighted table
//   m, v, var           float32 [R, D], updated in place (contiguous last dimension, row stride
//                       free; they must not share elements with each other or with the inputs)
// B and L may change from run to run; everything else is the plan's.
struct EmbeddingBagLazyAdamTensors {
  TensorView grad_output, indices, offsets, per_sample_weights, m, v, var;
};

// The per-step scalar: lr, or (when lr_tensor is set: one float32 element) read from it at run
// time.
struct EmbeddingBagLazyAdamScalars {
  float lr = 0.0f;
  TensorView lr_tensor;
};

// What a plan is made for: the table (R, D, strides), the dtypes of every tensor, the pooling mode,
// weighted or not, the attributes. The batch sizes of the tensors it is made from are not kept as
// part of the problem: check() takes any B and L.
class EmbeddingBagLazyAdamProblem {
 public:
  FUSEKIT_API static Status make(const EmbeddingBagLazyAdamTensors &tensors,
                                 const EmbeddingBagLazyAdamOptions &options,
                                 EmbeddingBagLazyAdamProblem *out);
  // Checks the tensors bound to a run: the problem's dtypes and table layouts, the batch tensors'
  // shapes consistent with each other (offsets B + 1, per_sample_weights L), data present, aligned,
  // no forbidden overlap.
  FUSEKIT_API Status check(const EmbeddingBagLazyAdamTensors &tensors) const;

  EmbeddingBagLazyAdamTensors desc;
  int64_t d = 0, rows = 0;
  bool weighted = false;
  PoolingMode pooling = PoolingMode::kSum;
  float beta1 = 0, beta2 = 0, epsilon = 0;
};

struct EmbeddingBagLazyAdamOp;  // (src/embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h)

class EmbeddingBagLazyAdam {
 public:
  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation and fixes the thread count. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const EmbeddingBagLazyAdamProblem &problem,
                                 const EmbeddingBagLazyAdamOptions &options,
                                 EmbeddingBagLazyAdam *out);
  // Phase one and a binding in one call, the tensors kept for run(lr, ...).
  FUSEKIT_API static Status plan(const EmbeddingBagLazyAdamTensors &tensors,
                                 const EmbeddingBagLazyAdamOptions &options,
                                 EmbeddingBagLazyAdam *out);

  // Bytes of workspace a run on these tensors needs (they depend on B, L and the thread count);
  // 0 for tensors the problem would refuse.
  FUSEKIT_API size_t workspace_size(const EmbeddingBagLazyAdamTensors &tensors) const;
  // The same for a batch of `bags` bags and `lookups` lookups.
  FUSEKIT_API size_t workspace_size(int64_t bags, int64_t lookups) const;
  const char *implementation() const { return state_.impl_name; }
  const EmbeddingBagLazyAdamProblem &problem() const { return state_.problem; }

  // Phase two, any number of times, on any batch: binds the tensors (checked against the problem),
  // then checks lr (finite), the offsets and every index before anything is written, then runs.
  FUSEKIT_API Status run(const EmbeddingBagLazyAdamTensors &tensors,
                         const EmbeddingBagLazyAdamScalars &scalars, void *workspace,
                         size_t workspace_size, EmbeddingBagLazyAdamStats *stats = nullptr,
                         StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(tensors, ...).
  FUSEKIT_API Status run(float lr, void *workspace, size_t workspace_size,
                         EmbeddingBagLazyAdamStats *stats = nullptr) const;

 private:
  PlanState<EmbeddingBagLazyAdamOp, EmbeddingBagLazyAdamProblem, EmbeddingBagLazyAdamTensors>
      state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status embedding_bag_lazy_adam_step(const EmbeddingBagLazyAdamTensors &tensors,
                                                float lr,
                                                const EmbeddingBagLazyAdamOptions &options = {},
                                                EmbeddingBagLazyAdamStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_H_
