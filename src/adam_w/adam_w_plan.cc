// AdamW, the C++ API: the problem is validated once, a plan picks an implementation from the list,
// and each run binds tensors and the step, then runs the implementation.
#include <algorithm>
#include <utility>

#include "adam_w/adam_w_impl.h"
#include "common/adam_update.h"
#include "common/plan.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/adam_w.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "AdamW";

}  // namespace

Status AdamWProblem::make(const AdamWTensors &t, const AdamWOptions &options, AdamWProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &var = t.var, &grad = t.grad, &m = t.m, &v = t.v;
  FUSEKIT_RETURN_IF_ERROR(check_var_grad_dtypes(kOp, "var", var, "grad", grad));
  if (m.dtype != DType::kFloat32 || v.dtype != DType::kFloat32) {
    return Status::Invalid(str_cat(kOp, ": m and v must be float32, got ", dtype_name(m.dtype),
                                   " and ", dtype_name(v.dtype)));
  }
  int64_t n = 0, other = 0;
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, var, "var", &n));
  const TensorView *all[4] = {&var, &grad, &m, &v};
  for (int i = 0; i < 4; ++i) {
    FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, *all[i], AdamWOp::kRoles[i].name, &other));
    if (other != n) {
      return Status::Invalid(str_cat(kOp, ": ", AdamWOp::kRoles[i].name, " has ", other,
                                     " elements ", all[i]->shape_string(), " but var has ", n,
                                     "; they must match"));
    }
    if (!all[i]->is_contiguous()) {
      return Status::Invalid(str_cat(kOp, ": ", AdamWOp::kRoles[i].name,
                                     " must be contiguous, got shape ", all[i]->shape_string(),
                                     " with strides ", all[i]->strides_string()));
    }
  }
  AdamAttributes attr;
  FUSEKIT_RETURN_IF_ERROR(check_adam_attributes(kOp, options.beta1, options.beta2,
                                                options.weight_decay, options.eps,
                                                options.gnorm_scale, &attr));
  if (options.decay_order != WeightDecayOrder::kAfterUpdate &&
      options.decay_order != WeightDecayOrder::kBeforeUpdate) {
    return Status::Invalid(str_cat(kOp, ": decay_order = ", static_cast<int>(options.decay_order),
                                   " must be 0 (kAfterUpdate, CANN's order) or 1 (kBeforeUpdate, "
                                   "torch.optim.AdamW's order)"));
  }
  AdamWProblem p;
  p.desc = without_data<AdamWOp>(t);
  p.n = n;
  set_adam_attributes(attr, &p);
  p.decay_order = options.decay_order;
  *out = p;
  return Status::Ok();
}

Status AdamWProblem::check(const AdamWTensors &t) const {
  return check_bound<AdamWOp>(desc, t);
}

std::string AdamWOp::problem_fields(const AdamWProblem &p, const AdamWTensors & /*t*/) {
  return str_cat("n=", p.n, ",dtype=", dtype_name(p.desc.var.dtype),
                 p.decay_order == WeightDecayOrder::kBeforeUpdate ? ",decay=before" : "");
}
std::string AdamWOp::result_fields(const AdamWStats &st) {
  return str_cat("skipped=", st.elements_skipped_nonfinite);
}

std::vector<std::string> AdamW::implementations() {
  return implementation_names<AdamWOp>();
}

Status AdamW::plan(const AdamWProblem &problem, const AdamWOptions &options, AdamW *out) {
  return make_plan<AdamWOp>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status AdamW::plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, const AdamWOptions &options, AdamW *out) {
  return make_bound_plan<AdamWOp>({var, grad, m, v}, options,
                                  out != nullptr ? &out->state_ : nullptr);
}

Status AdamW::run(const AdamWTensors &tensors, const AdamWScalars &scalars, AdamWStats *stats,
                  StreamHandle stream) const {
  return run_plan<AdamWOp>(state_, tensors, scalars, nullptr, 0, stats, stream);
}

Status AdamW::run(int64_t step, float lr, AdamWStats *stats) const {
  AdamWScalars s;
  s.step = step;
  s.lr = lr;
  return run_bound<AdamWOp>(state_, s, nullptr, 0, stats, "run(step, lr, ...)");
}

Status adam_w_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, int64_t step, float lr, const AdamWOptions &options,
                   AdamWStats *stats) {
  AdamWScalars s;
  s.step = step;
  s.lr = lr;
  return run_once<AdamWOp>({var, grad, m, v}, options, s, stats);
}

}  // namespace fusekit
