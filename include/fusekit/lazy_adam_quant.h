// fusekit: LazyAdamQuant, LazyAdam with 8-bit states: one Adam step on the embedding rows a batch
// touched, with m and v kept as uint8 codes into two 256-entry maps and one float32 scale (absmax)
// per row and block of at most 256 columns: the optimizer state of a [R, D] table in 2 D + 8
// ceil(D / 256) bytes per row instead of 8 D. A fusekit extension (CANN and Rec SDK have no such
// operator): LazyAdam's update (fusekit/lazy_adam.h) on ApplyAdamWQuant's quantized state
// (fusekit/apply_adam_w_quant.h).
//
//   for each distinct row r named by indices (negative indices are padding and are skipped):
//     g   = sum of the gradient rows whose index is r, in order of occurrence, in float32
//     per block b of the row (columns [256 b, min(D, 256 b + 256))), per column:
//       m   = qmap_m[m_code] * absmax_m[r, b];   v = qmap_v[v_code] * absmax_v[r, b]
//       m   = m * beta1 + g * (1 - beta1)
//       v   = |v * beta2 + (g * g) * (1 - beta2)|
//       var = var + (m * -lr) / (sqrt(v) + epsilon)
//     per block: absmax_m = max |m|, absmax_v = max v; codes = the nearest map entry to m /
//     absmax_m (resp. v / absmax_v; an absmax of 0 divides by 1), ties to the lower index, and for
//     m the sign fix (ApplyAdamWQuant's rule, docs/apply_adam_w_quant.md).
//
// All in float32, in exactly this order (LazyAdam's, with the dequantization first and the
// requantization last); no bias correction inside: pass lr_t = lr * sqrt(1 - beta2^t) /
// (1 - beta1^t). var may be float32, bfloat16 or float16 (widened on load, rounded to nearest-even
// on store); the gradient is var's dtype or float32. The guard: a row whose new m, v or var (var
// as its dtype stores it) would be NaN or Inf in any column (a NaN or Inf summed gradient is one
// case) is left bit for bit unchanged (var, codes, absmax) and counted. Untouched rows are never
// read or written. See docs/lazy_adam_quant.md.
//
// A LazyAdamQuantProblem (shapes, dtypes, strides, attributes) is validated once;
// LazyAdamQuant::plan() picks an implementation ("cpu_avx512vbmi", "cpu_hwy", "cpu_reference") and
// sizes the workspace; run() binds the tensors and lr of one step, checks the data (both maps, the
// indices, lr) before writing anything, then updates in place. A plan is reused for any number of
// steps.
#ifndef FUSEKIT_LAZY_ADAM_QUANT_H_
#define FUSEKIT_LAZY_ADAM_QUANT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/device.h"
#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/plan_state.h"
#include "fusekit/quant_map.h"  // create_dynamic_map
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Columns per absmax block of a row: a row of D columns has ceil(D / 256) blocks, [0, 256),
// [256, 512), ...; a block never spans two rows.
inline constexpr int64_t kLazyAdamQuantBlockSize = 256;

struct LazyAdamQuantOptions {
  // The attributes as the aclnn call takes them (doubles, converted to float32 when planned).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-7;
  // How m and v are kept (fusekit/quant_map.h; docs/fp8_state.md). kFp8: qmap_m and qmap_v are
  // empty, absmax_m and absmax_v hold the blocks' scales.
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  // The lost-v guard (docs/fp8_state.md): off by default in the dynamic-map format, always on in
  // kFp8.
  bool guard_lost_v = false;
  KernelChoice kernel = KernelChoice::kAuto;
  const char *implementation = nullptr;  // a name from LazyAdamQuant::implementations(), or auto
  int num_threads = 0;                   // 0: fusekit::num_threads() when the plan is made
};

struct LazyAdamQuantStats {
  int64_t rows_updated = 0;  // distinct rows written
  // Distinct rows left bit for bit unchanged: a new m, v or var (as stored) would be NaN or Inf (a
  // NaN or Inf summed gradient, an overflow of the step, non-finite state).
  int64_t rows_skipped_nonfinite = 0;
  int64_t indices_padding = 0;  // negative indices (ignored)
};

// The tensors of one run. gradient: var's dtype or float32, [N, D]; indices: int32 or int64, [N] or
// [N, 1]; m, v: uint8 codes [R, D]; var: float32, bfloat16 or float16 [R, D]; qmap_m, qmap_v:
// float32 [256] (any stride); absmax_m, absmax_v: float32 [R, ceil(D / 256)]. Every 2-D tensor
// needs a contiguous last dimension; row strides are free (the written tables' rows must not
// overlap). var, m, v, absmax_m and absmax_v are updated in place and must not share memory with
// each other or with any input.
struct LazyAdamQuantTensors {
  TensorView gradient, indices, m, v, var, qmap_m, qmap_v, absmax_m, absmax_v;
};

// The per-step scalars. When lr_tensor is set (one float32 element), the implementation reads lr
// from it at run time, where it lives, instead of from `lr` (the aclnn face passes its lr tensor).
struct LazyAdamQuantScalars {
  float lr = 0.0f;
  TensorView lr_tensor;
};

// What a plan is made for: shapes, dtypes, strides, devices and attributes. Data pointers are not
// looked at (the descriptions keep them null).
class LazyAdamQuantProblem {
 public:
  // Validates everything that shapes, dtypes, strides and attributes can tell.
  FUSEKIT_API static Status make(const LazyAdamQuantTensors &tensors,
                                 const LazyAdamQuantOptions &options, LazyAdamQuantProblem *out);
  // Checks the tensors bound to a run: the problem's layouts, data present, no forbidden overlap.
  FUSEKIT_API Status check(const LazyAdamQuantTensors &tensors) const;

  LazyAdamQuantTensors desc;
  int64_t n = 0, d = 0, rows = 0, blocks = 0;  // blocks: absmax blocks per row, ceil(d / 256)
  float beta1 = 0, beta2 = 0, epsilon = 0;
  QuantStateFormat state_format = QuantStateFormat::kDynamicMap;
  bool guard_lost_v = false;  // always true for kFp8
};

struct LazyAdamQuantOp;  // the operator as the plan layer sees it (lazy_adam_quant_impl.h)

class LazyAdamQuant {
 public:
  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation (the first that supports the problem on this machine, or
  // the one the options ask for) and books its workspace. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const LazyAdamQuantProblem &problem,
                                 const LazyAdamQuantOptions &options, LazyAdamQuant *out);
  // Phase one and a binding in one call: the problem of these tensors, planned, with the tensors
  // kept for run(lr, ...) below.
  FUSEKIT_API static Status plan(const LazyAdamQuantTensors &tensors,
                                 const LazyAdamQuantOptions &options, LazyAdamQuant *out);

  // Bytes of scratch memory a run needs (run() aligns the pointer).
  size_t workspace_size() const { return state_.workspace_bytes; }
  // The implementation the plan runs ("cpu_avx512vbmi", "cpu_hwy", "cpu_reference").
  const char *implementation() const { return state_.impl_name; }
  const LazyAdamQuantProblem &problem() const { return state_.problem; }

  // Phase two, any number of times: binds the tensors (checked against the problem: same layouts,
  // data present, no overlap; the pointers may change from run to run) and the scalars, checks lr
  // (finite), both maps (256 finite floats in ascending order, ties allowed) and every index (an
  // index >= R fails with kInvalidArgument naming the position and value), all before anything is
  // written, then runs.
  FUSEKIT_API Status run(const LazyAdamQuantTensors &tensors, const LazyAdamQuantScalars &scalars,
                         void *workspace, size_t workspace_size,
                         LazyAdamQuantStats *stats = nullptr, StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(tensors, ...).
  FUSEKIT_API Status run(float lr, void *workspace, size_t workspace_size,
                         LazyAdamQuantStats *stats = nullptr) const;

  int64_t num_indices() const { return state_.problem.n; }
  int64_t dim() const { return state_.problem.d; }
  int64_t table_rows() const { return state_.problem.rows; }

 private:
  PlanState<LazyAdamQuantOp, LazyAdamQuantProblem, LazyAdamQuantTensors> state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status lazy_adam_quant_step(const LazyAdamQuantTensors &tensors, float lr,
                                        const LazyAdamQuantOptions &options = {},
                                        LazyAdamQuantStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_QUANT_H_
