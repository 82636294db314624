// AdamW, the C++ API: the problem is validated once, a plan picks an implementation from the list,
// and each run binds tensors and the step, then runs the implementation.
#include <algorithm>
#include <utility>

#include "adam_w/adam_w_impl.h"
#include "common/adam_update.h"
#include "common/implementation.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/adam_w.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "AdamW";
// The tensors by role, in the order of AdamWTensors: var, m and v written in place.
constexpr TensorRole kRoles[4] = {{"var", true}, {"grad"}, {"m", true}, {"v", true}};

bool is_float_type(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

std::string strides_string(const TensorView &t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
  return s + "]";
}

TensorView without_data(TensorView t) {
  t.data = nullptr;
  return t;
}

}  // namespace

Status AdamWProblem::make(const AdamWTensors &t, const AdamWOptions &options, AdamWProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &var = t.var, &grad = t.grad, &m = t.m, &v = t.v;
  if (!is_float_type(var.dtype)) {
    return Status::Invalid(str_cat(kOp, ": var has dtype ", dtype_name(var.dtype),
                                   "; float32, float16 or bfloat16 is required"));
  }
  if (grad.dtype != var.dtype) {
    return Status::Invalid(str_cat(kOp, ": grad has dtype ", dtype_name(grad.dtype),
                                   " but var has ", dtype_name(var.dtype), "; they must match"));
  }
  if (m.dtype != DType::kFloat32 || v.dtype != DType::kFloat32) {
    return Status::Invalid(str_cat(kOp, ": m and v must be float32, got ", dtype_name(m.dtype),
                                   " and ", dtype_name(v.dtype)));
  }
  int64_t n = 0, other = 0;
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, var, "var", &n));
  const TensorView *all[4] = {&var, &grad, &m, &v};
  for (int i = 0; i < 4; ++i) {
    FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, *all[i], kRoles[i].name, &other));
    if (other != n) {
      return Status::Invalid(str_cat(kOp, ": ", kRoles[i].name, " has ", other, " elements ",
                                     all[i]->shape_string(), " but var has ", n,
                                     "; they must match"));
    }
    if (!all[i]->is_contiguous()) {
      return Status::Invalid(str_cat(kOp, ": ", kRoles[i].name, " must be contiguous, got shape ",
                                     all[i]->shape_string(), " with strides ",
                                     strides_string(*all[i])));
    }
  }
  AdamAttributes attr;
  FUSEKIT_RETURN_IF_ERROR(check_adam_attributes(kOp, options.lr, options.beta1, options.beta2,
                                                options.weight_decay, options.eps,
                                                options.gnorm_scale, &attr));
  AdamWProblem p;
  p.desc = {without_data(var), without_data(grad), without_data(m), without_data(v)};
  p.n = n;
  p.lr = attr.lr;
  p.beta1 = attr.beta1;
  p.beta2 = attr.beta2;
  p.weight_decay = attr.weight_decay;
  p.eps = attr.eps;
  p.gnorm_scale = attr.gnorm_scale;
  *out = p;
  return Status::Ok();
}

Status AdamWProblem::check(const AdamWTensors &t) const {
  const TensorView *planned[4] = {&desc.var, &desc.grad, &desc.m, &desc.v};
  const TensorView *bound[4] = {&t.var, &t.grad, &t.m, &t.v};
  return check_bound_tensors(kOp, kRoles, planned, bound);
}

std::vector<std::string> AdamW::implementations() {
  return implementation_names(adam_w_impls());
}

Status AdamW::plan(const AdamWProblem &problem, const AdamWOptions &options, AdamW *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  AdamW p;
  FUSEKIT_RETURN_IF_ERROR(choose_implementation(kOp, adam_w_impls(), problem, options.kernel,
                                                options.implementation, &p.impl_));
  p.problem_ = problem;
  p.threads_ = std::max(1, options.num_threads > 0 ? options.num_threads : num_threads());
  *out = p;
  return Status::Ok();
}

Status AdamW::plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, const AdamWOptions &options, AdamW *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const AdamWTensors tensors{var, grad, m, v};
  AdamWProblem problem;
  FUSEKIT_RETURN_IF_ERROR(AdamWProblem::make(tensors, options, &problem));
  FUSEKIT_RETURN_IF_ERROR(problem.check(tensors));
  AdamW p;
  FUSEKIT_RETURN_IF_ERROR(plan(problem, options, &p));
  p.bound_ = tensors;
  p.has_bound_ = true;
  *out = p;
  return Status::Ok();
}

const char *AdamW::implementation() const {
  return impl_ != nullptr ? impl_->name : "none";
}

Status AdamW::run(const AdamWTensors &tensors, const AdamWScalars &scalars, AdamWStats *stats,
                  StreamHandle stream) const {
  AdamWStats local;
  AdamWStats &st = stats != nullptr ? *stats : local;
  st = AdamWStats();
  if (impl_ == nullptr) return Status::Invalid(str_cat(kOp, ": run on a plan that was not made"));
  StageTimer timer;
  FUSEKIT_RETURN_IF_ERROR(problem_.check(tensors));
  AdamWScalars s = scalars;
  FUSEKIT_RETURN_IF_ERROR(read_scalar_tensor(kOp, "step", s.step_tensor, DType::kInt64, &s.step));
  FUSEKIT_RETURN_IF_ERROR(check_adam_step(kOp, s.step));
  RunContext ctx;
  ctx.threads = threads_;
  ctx.stream = stream;
  ctx.timer = &timer;
  timer.stage("bind");
  FUSEKIT_RETURN_IF_ERROR(impl_->run(problem_, tensors, s, ctx, &st));
  if (timer.on()) {
    verbose_print(str_cat(kOp, ",n=", problem_.n, ",dtype=", dtype_name(problem_.desc.var.dtype),
                          ",impl=", impl_->name, ",isa=", impl_->target(), ",threads=", threads_,
                          ",step=", s.step, ",skipped=", st.elements_skipped_nonfinite, ",",
                          timer.fields()));
  }
  return Status::Ok();
}

Status AdamW::run(int64_t step, AdamWStats *stats) const {
  if (!has_bound_) {
    if (stats != nullptr) *stats = AdamWStats();
    return Status::Invalid(
        str_cat(kOp, ": run(step, ...) needs a plan made from tensors; pass the tensors to run()"));
  }
  AdamWScalars s;
  s.step = step;
  return run(bound_, s, stats);
}

Status adam_w_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, int64_t step, const AdamWOptions &options,
                   AdamWStats *stats) {
  AdamW plan;
  FUSEKIT_RETURN_IF_ERROR(AdamW::plan(var, grad, m, v, options, &plan));
  return plan.run(step, stats);
}

}  // namespace fusekit
