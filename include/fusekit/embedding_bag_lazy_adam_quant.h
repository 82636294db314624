// fusekit: EmbeddingBagLazyAdamQuant, the 8-bit twin of EmbeddingBagLazyAdam: the backward of an
// embedding bag fused with a LazyAdamQuant step (LazyAdam with 8-bit m and v) on the rows it looked
// up. No gradient of the table and no per-lookup gradient [L, D] is ever materialized.
//
//   for each distinct row r named by indices:
//     g = x_{i1} + x_{i2} + ..., x_i = grad_output[b_i] * c_i over the lookups i of r in
//         occurrence order (EmbeddingBagLazyAdam's gradient: fusekit/embedding_bag_lazy_adam.h)
//     then LazyAdamQuant's row step on g (fusekit/lazy_adam_quant.h): m and v decoded from their
//     codes and the row's block scales, LazyAdam's update, the guard on what the step produces,
//     the codes and scales of the new m and v.
//
// The state is LazyAdamQuant's, in either state format (QuantStateFormat::kDynamicMap with its
// maps, or kFp8) and with its lost-v guard: m, v uint8 [R, D]; absmax_m, absmax_v float32
// [R, ceil(D / 256)]; qmap_m, qmap_v float32 [256] (empty views in the FP8 format). So a table's
// state moves between this operator, LazyAdamQuant and fusekit.torch.SparseAdam8bit as it is.
// var and grad_output are float32. See docs/embedding_bag_lazy_adam_quant.md.
//
// The batch (B bags, L lookups) is bound per run, as for EmbeddingBagLazyAdam: a problem and a
// plan are made for the table, the dtypes, the pooling, weighted or not and the attributes, and
// run any batch; workspace_size(tensors) (or workspace_size(B, L)) says what a run needs.
#ifndef FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_H_
#define FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/device.h"
#include "fusekit/embedding_bag_lazy_adam.h"  // PoolingMode, the stats and scalars
#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/plan_state.h"
#include "fusekit/quant_map.h"  // QuantStateFormat, create_dynamic_map
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

struct EmbeddingBagLazyAdamQuantOptions {
  // Converted to float32 when planned: beta1, beta2 in [0, 1), epsilon finite and > 0 (as float32).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  PoolingMode pooling = PoolingMode::kSum;
  // LazyAdamQuant's (docs/fp8_state.md): the state format, and the lost-v guard (off by default in
  // the dynamic-map format, always on in kFp8).
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  bool guard_lost_v = false;
  KernelChoice kernel = KernelChoice::kAuto;
  const char *implementation = nullptr;  // a name from EmbeddingBagLazyAdamQuant::implementations()
  int num_threads = 0;                   // 0: fusekit::num_threads() when the plan is made
};

// rows_updated, rows_skipped_nonfinite (a row whose new m, v or var would be NaN or Inf: a
// non-finite gradient, an overflow, non-finite state, as LazyAdamQuant counts them).
using EmbeddingBagLazyAdamQuantStats = EmbeddingBagLazyAdamStats;
// lr (already bias-corrected), or lr_tensor (one float32 element) read at run time.
using EmbeddingBagLazyAdamQuantScalars = EmbeddingBagLazyAdamScalars;

// The tensors of one run: EmbeddingBagLazyAdam's batch tensors (grad_output float32 [B, D],
// indices and offsets int32 or int64 [L] and [B + 1], per_sample_weights float32 [L] or an empty
// view) and LazyAdamQuant's state (m, v uint8 [R, D]; var float32 [R, D]; qmap_m, qmap_v float32
// [256], any stride, or empty views in the FP8 format; absmax_m, absmax_v float32
// [R, ceil(D / 256)]). 2-D tensors have a contiguous last dimension, any row stride; var, m, v and
// both absmax are updated in place and must not share elements with each other or with an input.
struct EmbeddingBagLazyAdamQuantTensors {
  TensorView grad_output, indices, offsets, per_sample_weights, m, v, var, qmap_m, qmap_v, absmax_m,
      absmax_v;
};

// What a plan is made for: the table (R, D, layouts), the dtypes, the pooling, weighted or not,
// the state format and the attributes; not B or L.
class EmbeddingBagLazyAdamQuantProblem {
 public:
  FUSEKIT_API static Status make(const EmbeddingBagLazyAdamQuantTensors &tensors,
                                 const EmbeddingBagLazyAdamQuantOptions &options,
                                 EmbeddingBagLazyAdamQuantProblem *out);
  // Checks the tensors bound to a run: the problem's dtypes and table layouts, the batch tensors'
  // shapes consistent with each other, data present, aligned, no forbidden overlap.
  FUSEKIT_API Status check(const EmbeddingBagLazyAdamQuantTensors &tensors) const;

  EmbeddingBagLazyAdamQuantTensors desc;
  int64_t d = 0, rows = 0, blocks = 0;  // blocks: absmax blocks per row, ceil(d / 256)
  bool weighted = false;
  PoolingMode pooling = PoolingMode::kSum;
  float beta1 = 0, beta2 = 0, epsilon = 0;
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  bool guard_lost_v = false;  // always true for kFp8
};

struct EmbeddingBagLazyAdamQuantOp;  // (src/embedding_bag_lazy_adam_quant/..._impl.h)

class EmbeddingBagLazyAdamQuant {
 public:
  // The implementations built into this library, in the order a plan tries them (LazyAdamQuant's:
  // "cpu_avx512vbmi", "cpu_hwy", then "cpu_reference" last; "cpu_hwy_table" and
  // "cpu_hwy_binary_search" by name only).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation and fixes the thread count. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const EmbeddingBagLazyAdamQuantProblem &problem,
                                 const EmbeddingBagLazyAdamQuantOptions &options,
                                 EmbeddingBagLazyAdamQuant *out);
  // Phase one and a binding in one call, the tensors kept for run(lr, ...).
  FUSEKIT_API static Status plan(const EmbeddingBagLazyAdamQuantTensors &tensors,
                                 const EmbeddingBagLazyAdamQuantOptions &options,
                                 EmbeddingBagLazyAdamQuant *out);

  // Bytes of workspace a run on these tensors needs (they depend on B, L and the thread count);
  // 0 for tensors the problem would refuse.
  FUSEKIT_API size_t workspace_size(const EmbeddingBagLazyAdamQuantTensors &tensors) const;
  // The same for a batch of `bags` bags and `lookups` lookups.
  FUSEKIT_API size_t workspace_size(int64_t bags, int64_t lookups) const;
  const char *implementation() const { return state_.impl_name; }
  const EmbeddingBagLazyAdamQuantProblem &problem() const { return state_.problem; }

  // Phase two, any number of times, on any batch: binds the tensors (checked against the problem),
  // then checks lr (finite), both maps (dynamic-map format), the offsets and every index before
  // anything is written, then runs.
  FUSEKIT_API Status run(const EmbeddingBagLazyAdamQuantTensors &tensors,
                         const EmbeddingBagLazyAdamQuantScalars &scalars, void *workspace,
                         size_t workspace_size, EmbeddingBagLazyAdamQuantStats *stats = nullptr,
                         StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(tensors, ...).
  FUSEKIT_API Status run(float lr, void *workspace, size_t workspace_size,
                         EmbeddingBagLazyAdamQuantStats *stats = nullptr) const;

 private:
  PlanState<EmbeddingBagLazyAdamQuantOp, EmbeddingBagLazyAdamQuantProblem,
            EmbeddingBagLazyAdamQuantTensors>
      state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status
embedding_bag_lazy_adam_quant_step(const EmbeddingBagLazyAdamQuantTensors &tensors, float lr,
                                   const EmbeddingBagLazyAdamQuantOptions &options = {},
                                   EmbeddingBagLazyAdamQuantStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_H_
