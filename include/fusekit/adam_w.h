// fusekit: AdamW, one AdamW step on float32 moments, element by element (CANN's ApplyAdamWQuant
// without the quantization; the tensors an 8-bit optimizer keeps in 32-bit, and the yardstick of
// the 8-bit operator's benchmark).
//
//   t   = step + 1                 c1 = 1 - beta1^t          c2s = sqrt(1 - beta2^t)
//   step_size = -lr * c2s / c1     (all derived scalars in float32, as CANN's kernel computes them)
//   per element:
//     g   = grad * gnorm_scale
//     m   = m * beta1 + g * (1 - beta1)
//     v   = v * beta2 + (g * g) * (1 - beta2)
//     var = var + (m * step_size) / (sqrt(v) + eps * c2s)
//     if weight_decay > 0: var = var * (1 - lr * weight_decay)       (after the Adam step)
// With decay_order = kBeforeUpdate (torch.optim.AdamW's order) the decay comes first instead:
//     if weight_decay > 0: var = var * (1 - lr * weight_decay)
//     var = var + (m * step_size) / (sqrt(v) + eps * c2s)
//
// The guard on what a step produces: an element whose new m, v or var (var as its dtype stores it:
// float16 overflows from 65520, bfloat16 from 3.3961776e38) would be NaN or Inf is left unchanged
// (var, m and v) and counted; a NaN or Inf gradient is one case, and so are a finite gradient whose
// square or scaled value overflows, and non-finite state. eps must be at least 2^-114
// (4.81482486e-35) in float32, so that eps * c2s >= 2^-126 is never 0. See docs/adam_w.md.
//
// An AdamWProblem (shapes, dtypes, attributes) is validated once; AdamW::plan() picks an
// implementation ("cpu_hwy", "cpu_reference"); run() binds the tensors, the step and the learning
// rate of one run, checks them, then updates in place. A plan is reused for any number of steps
// (a learning-rate schedule needs no new plan). No workspace.
#ifndef FUSEKIT_ADAM_W_H_
#define FUSEKIT_ADAM_W_H_

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

// Where the decoupled weight decay var *= 1 - lr * weight_decay is applied. After the Adam update
// is CANN's ApplyAdamWQuant and bitsandbytes' order (the default, and the order of the aclnn face);
// before it is torch.optim.AdamW's, DeepSpeedCPUAdam's and the AdamW paper's (Loshchilov and
// Hutter). The two differ by lr^2 * weight_decay * update per step.
enum class WeightDecayOrder : int { kAfterUpdate = 0, kBeforeUpdate = 1 };

struct AdamWOptions {
  // The attributes as ApplyAdamWQuant takes them (doubles, converted to float32 when planned);
  // the learning rate is a per-run scalar (AdamWScalars).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
  double eps = 1e-8;  // >= 2^-114 (4.81482486e-35) in float32, else kInvalidArgument
  double gnorm_scale = 1.0;
  // kAfterUpdate or kBeforeUpdate; any other value is refused (kInvalidArgument).
  WeightDecayOrder decay_order = WeightDecayOrder::kAfterUpdate;
  KernelChoice kernel = KernelChoice::kAuto;
  int num_threads = 0;                   // 0: fusekit::num_threads() when the plan is made
  const char *implementation = nullptr;  // a name from AdamW::implementations(), or null: auto
};

struct AdamWStats {
  // Left unchanged: a new m, v or var (as stored) would be NaN or Inf (a NaN or Inf gradient, an
  // overflow of the step, non-finite state).
  int64_t elements_skipped_nonfinite = 0;
};

// The tensors of one run. var, grad: float32, float16 or bfloat16 (the same), contiguous, n
// elements (any shapes of n elements); m, v: float32, contiguous, n elements. var, m and v are
// updated in place and must not overlap each other or grad.
struct AdamWTensors {
  TensorView var, grad, m, v;
};

// The per-run scalars: the step (0 <= step < 2^62; t = step + 1) and the learning rate (finite,
// >= 0). When step_tensor (one int64 element) or lr_tensor (one float32 element) is set, the
// implementation reads the value from it, where it lives, when it runs.
struct AdamWScalars {
  int64_t step = 0;
  float lr = 1e-3f;
  TensorView step_tensor, lr_tensor;
};

// What a plan is made for: shapes, dtypes, strides, devices and attributes. Data pointers are not
// looked at (the descriptions keep them null).
class AdamWProblem {
 public:
  // Validates everything that shapes, dtypes, strides and attributes can tell.
  FUSEKIT_API static Status make(const AdamWTensors &tensors, const AdamWOptions &options,
                                 AdamWProblem *out);
  // Checks the tensors bound to a run: the problem's layouts, data present, no overlap.
  FUSEKIT_API Status check(const AdamWTensors &tensors) const;

  AdamWTensors desc;
  int64_t n = 0;
  float beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0, gnorm_scale = 0;
  WeightDecayOrder decay_order = WeightDecayOrder::kAfterUpdate;
};

struct AdamWOp;  // the operator as the plan layer sees it (src/adam_w/adam_w_impl.h)

class AdamW {
 public:
  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation (the first that supports the problem on this machine, or
  // the one the options ask for). Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const AdamWProblem &problem, const AdamWOptions &options,
                                 AdamW *out);
  // Phase one and a binding in one call: the problem of these tensors, planned, with the tensors
  // kept for run(step, lr, ...) below.
  FUSEKIT_API static Status plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                                 const TensorView &v, const AdamWOptions &options, AdamW *out);

  // The implementation the plan runs ("cpu_hwy", "cpu_reference").
  const char *implementation() const { return state_.impl_name; }
  const AdamWProblem &problem() const { return state_.problem; }

  // Phase two, any number of times: binds the tensors (checked against the problem: same layouts,
  // data present, no overlap; the pointers may change from run to run) and the scalars (0 <= step
  // < 2^62, t = step + 1 as for ApplyAdamWQuant; lr finite and >= 0), then runs.
  FUSEKIT_API Status run(const AdamWTensors &tensors, const AdamWScalars &scalars,
                         AdamWStats *stats = nullptr, StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(var, ...).
  FUSEKIT_API Status run(int64_t step, float lr, AdamWStats *stats = nullptr) const;

  int64_t numel() const { return state_.problem.n; }

 private:
  PlanState<AdamWOp, AdamWProblem, AdamWTensors> state_;
};

// One call: plan and run.
FUSEKIT_API Status adam_w_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                               const TensorView &v, int64_t step, float lr,
                               const AdamWOptions &options = {}, AdamWStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_ADAM_W_H_
