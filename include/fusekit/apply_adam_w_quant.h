// fusekit: ApplyAdamWQuant, one AdamW step whose moments m and v are kept as 8-bit codes into two
// 256-entry maps with one float32 scale (absmax) per block of 256 elements (the block-wise 8-bit
// optimizer of Dettmers et al., bitsandbytes' AdamW8bit). AdamW, the same step on float32 moments,
// is its own operator (fusekit/adam_w.h, included here so that existing users still compile).
//
//   t   = step + 1                 c1 = 1 - beta1^t          c2s = sqrt(1 - beta2^t)
//   step_size = -lr * c2s / c1     (all derived scalars in float32, as CANN's kernel computes them)
//   per element of block b:
//     g   = grad * gnorm_scale
//     m   = qmap_m[m_code] * absmax_m[b];   v = qmap_v[v_code] * absmax_v[b]      (8-bit only)
//     m   = m * beta1 + g * (1 - beta1)
//     v   = v * beta2 + (g * g) * (1 - beta2)
//     var = var + (m * step_size) / (sqrt(v) + eps * c2s)
//     if weight_decay > 0: var = var * (1 - lr * weight_decay)       (after the Adam step)
//   per block (8-bit only): absmax_m = max |m|, absmax_v = max v; codes = the nearest map entry to
//   m / absmax_m (resp. v / absmax_v; an absmax of 0 divides by 1), ties to the lower index, and
//   for m the sign fix (see docs/apply_adam_w_quant.md).
//
// This is CANN's kernel (t = step + 1, decay after the step), not the seed document's formula.
// The guard on what a step produces: a block whose new m, v, absmax or var (var as its dtype stores
// it: float16 overflows from 65520, bfloat16 from 3.3961776e38) would be NaN or Inf is left
// bit-for-bit unchanged (var, codes, absmax) and counted; a NaN or Inf gradient is one case, and so
// are a finite gradient whose square or scaled value overflows, and non-finite state (a NaN or
// infinite absmax or var). eps must be at least 2^-114 (4.81482486e-35) in float32, so that
// eps * c2s >= 2^-126 is never 0 (c2s >= 2^-12 for every beta2 < 1 and step). See
// docs/apply_adam_w_quant.md.
//
// An ApplyAdamWQuantProblem (shapes, dtypes, strides, attributes) is validated once;
// ApplyAdamWQuant::plan() picks an implementation ("cpu_avx512vbmi", "cpu_hwy", "cpu_reference")
// and sizes the workspace; run() binds the tensors and the step of one run, checks the data (the
// step, both maps) before writing anything, then updates in place. A plan is reused for any number
// of steps.
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/adam_w.h"  // AdamW, for the users of this header before it had its own
#include "fusekit/device.h"
#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/plan_state.h"
#include "fusekit/quant_map.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Elements per absmax block (the only block size CANN's kernel and this one accept).
inline constexpr int64_t kAdamWQuantBlockSize = 256;
// kQuantMapSize and create_dynamic_map() are in fusekit/quant_map.h (shared with LazyAdamQuant).

struct ApplyAdamWQuantOptions {
  // The attributes as the aclnn call takes them (doubles, converted to float32 when planned); lr
  // and step are per-run scalars (ApplyAdamWQuantScalars).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
  double eps = 1e-8;  // >= 2^-114 (4.81482486e-35) in float32, else kInvalidArgument
  double gnorm_scale = 1.0;
  int64_t block_size = kAdamWQuantBlockSize;  // must be 256
  // How m and v are kept (fusekit/quant_map.h; docs/fp8_state.md). kFp8: qmap_m and qmap_v are
  // empty, absmax_m and absmax_v hold the blocks' scales.
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  // The lost-v guard (docs/fp8_state.md): a v whose code decodes to 0 while m's does not is taken
  // as m * m before the update, so that the step is never m / eps. Off by default in the dynamic-
  // map format (CANN's and bitsandbytes' arithmetic); always on in kFp8.
  bool guard_lost_v = false;
  KernelChoice kernel = KernelChoice::kAuto;
  int num_threads = 0;  // 0: fusekit::num_threads() when the plan is made
  // A name from ApplyAdamWQuant::implementations(), or null: the kernel choice decides.
  const char *implementation = nullptr;
};

struct ApplyAdamWQuantStats {
  int64_t blocks_updated = 0;
  // Left bit-for-bit unchanged: a new m, v, absmax or var (as stored) would be NaN or Inf (a NaN
  // or Inf gradient, an overflow of the step, non-finite state).
  int64_t blocks_skipped_nonfinite = 0;
};

// The tensors of one run. var, grad: float32, float16 or bfloat16 (the same), 1 to 8 dimensions, n
// elements; m, v: uint8 codes of var's shape; qmap_m, qmap_v: float32 [256]; absmax_m, absmax_v:
// float32 [ceil(n / 256)]. var, m, v, absmax_m and absmax_v are updated in place and must not share
// memory with each other or with any input. var, grad, m and v may have any strides (a view that
// is not contiguous runs on a gathering path); the 1-D tensors may have any stride.
struct ApplyAdamWQuantTensors {
  TensorView var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v;
};

// The per-run scalars: the step (0 <= step < 2^62; t = step + 1) and the learning rate (finite,
// >= 0). When step_tensor (one int64 element) or lr_tensor (one float32 element) is set, the
// implementation reads the value from it, where it lives, when it runs (the aclnn face passes its
// step tensor).
struct ApplyAdamWQuantScalars {
  int64_t step = 0;
  float lr = 1e-3f;
  TensorView step_tensor, lr_tensor;
};

// What a plan is made for: shapes, dtypes, strides, devices and attributes. Data pointers are not
// looked at (the descriptions keep them null).
class ApplyAdamWQuantProblem {
 public:
  // Validates everything that shapes, dtypes, strides and attributes can tell.
  FUSEKIT_API static Status make(const ApplyAdamWQuantTensors &tensors,
                                 const ApplyAdamWQuantOptions &options,
                                 ApplyAdamWQuantProblem *out);
  // Checks the tensors bound to a run: the problem's layouts, data present, no forbidden overlap.
  FUSEKIT_API Status check(const ApplyAdamWQuantTensors &tensors) const;

  ApplyAdamWQuantTensors desc;
  int64_t n = 0, blocks = 0;
  bool contiguous = true;  // var, grad, m and v all contiguous (else the gathering path)
  float beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0, gnorm_scale = 0;
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  bool guard_lost_v = false;  // always true for kFp8
};

struct ApplyAdamWQuantOp;  // the operator as the plan layer sees it (apply_adam_w_quant_impl.h)

class ApplyAdamWQuant {
 public:
  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation (the first that supports the problem on this machine, or
  // the one the options ask for) and books its workspace. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const ApplyAdamWQuantProblem &problem,
                                 const ApplyAdamWQuantOptions &options, ApplyAdamWQuant *out);
  // Phase one and a binding in one call: the problem of these tensors, planned, with the tensors
  // kept for run(step, lr, ...) below.
  FUSEKIT_API static Status plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                                 const TensorView &v, const TensorView &qmap_m,
                                 const TensorView &qmap_v, const TensorView &absmax_m,
                                 const TensorView &absmax_v, const ApplyAdamWQuantOptions &options,
                                 ApplyAdamWQuant *out);

  // Bytes of scratch memory a run needs (the search tables of both maps when they are not cached,
  // and the lookup tables where the implementation uses them; run() aligns the pointer).
  size_t workspace_size() const { return state_.workspace_bytes; }
  // The implementation the plan runs ("cpu_avx512vbmi", "cpu_hwy", "cpu_reference", ...).
  const char *implementation() const { return state_.impl_name; }
  const ApplyAdamWQuantProblem &problem() const { return state_.problem; }

  // Phase two, any number of times: binds the tensors (checked against the problem: same layouts,
  // data present, no overlap; the pointers may change from run to run) and the scalars, checks
  // them (0 <= step < 2^62, lr finite and >= 0) and both maps (256 finite floats in ascending
  // order, ties allowed) before writing anything, then runs.
  FUSEKIT_API Status run(const ApplyAdamWQuantTensors &tensors,
                         const ApplyAdamWQuantScalars &scalars, void *workspace,
                         size_t workspace_size, ApplyAdamWQuantStats *stats = nullptr,
                         StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(var, ...).
  FUSEKIT_API Status run(int64_t step, float lr, void *workspace, size_t workspace_size,
                         ApplyAdamWQuantStats *stats = nullptr) const;

  int64_t numel() const { return state_.problem.n; }
  int64_t num_blocks() const { return state_.problem.blocks; }

 private:
  PlanState<ApplyAdamWQuantOp, ApplyAdamWQuantProblem, ApplyAdamWQuantTensors> state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status apply_adam_w_quant_step(const TensorView &var, const TensorView &grad,
                                           const TensorView &m, const TensorView &v,
                                           const TensorView &qmap_m, const TensorView &qmap_v,
                                           const TensorView &absmax_m, const TensorView &absmax_v,
                                           int64_t step, float lr,
                                           const ApplyAdamWQuantOptions &options = {},
                                           ApplyAdamWQuantStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_H_
