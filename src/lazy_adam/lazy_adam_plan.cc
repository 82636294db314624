// LazyAdam, the C++ API: the problem is validated once, a plan picks an implementation from the
// list and books its workspace, and each run binds tensors and scalars, then runs the
// implementation (whose stages do the per-step data work: lazy_adam_cpu.cc).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "common/implementation.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/threading.h"
#include "lazy_adam/lazy_adam_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "LazyAdam";

Status check_float_table(const TensorView &t, const char *name) {
  if (t.dtype != DType::kFloat32) {
    return Status::Invalid(str_cat(kOp, ": ", name, " has dtype ", dtype_name(t.dtype),
                                   "; only float32 is supported"));
  }
  if (t.ndim != 2) {
    return Status::Invalid(str_cat(kOp, ": ", name, " must be 2-D, got shape ", t.shape_string()));
  }
  if (!t.inner_contiguous()) {
    return Status::Invalid(str_cat(kOp, ": ", name,
                                   " must have a contiguous last dimension, got strides [",
                                   t.strides[0], ", ", t.strides[1], "]"));
  }
  if (t.strides[0] < 0) {
    return Status::Invalid(str_cat(kOp, ": ", name, " has a negative row stride ", t.strides[0]));
  }
  int64_t extent = 0;
  if (__builtin_mul_overflow(t.shape[0], std::max<int64_t>(t.strides[0], t.shape[1]), &extent)) {
    return Status::Invalid(
        str_cat(kOp, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  return Status::Ok();
}

// The tensors by role, named as the aclnn call names them, in the order of LazyAdamTensors: the
// tables written in place.
constexpr TensorRole kRoles[5] = {
    {"gradient"}, {"indices"}, {"inputM", true}, {"inputV", true}, {"inputVar", true}};

TensorView without_data(TensorView t) {
  t.data = nullptr;
  return t;
}

}  // namespace

Status LazyAdamProblem::make(const LazyAdamTensors &t, const LazyAdamOptions &options,
                             LazyAdamProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &gradient = t.gradient, &indices = t.indices, &m = t.m, &v = t.v, &var = t.var;
  FUSEKIT_RETURN_IF_ERROR(check_float_table(gradient, "gradient"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(m, "inputM"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(v, "inputV"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(var, "inputVar"));
  // The tables are written: two of their rows must not share elements.
  for (const auto &[x, name] :
       {std::pair{&m, "inputM"}, std::pair{&v, "inputV"}, std::pair{&var, "inputVar"}}) {
    if (x->shape[0] > 1 && x->shape[1] > 0 && x->strides[0] < x->shape[1]) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has row stride ", x->strides[0], " < ",
                                     x->shape[1], " columns: its rows overlap"));
    }
  }
  if (indices.dtype != DType::kInt32 && indices.dtype != DType::kInt64) {
    return Status::Invalid(str_cat(kOp, ": indices has dtype ", dtype_name(indices.dtype),
                                   "; int32 or int64 is required"));
  }
  if (!(indices.ndim == 1 || (indices.ndim == 2 && indices.shape[1] == 1))) {
    return Status::Invalid(
        str_cat(kOp, ": indices must have shape [N] or [N, 1], got ", indices.shape_string()));
  }
  const int64_t n = indices.shape[0];
  if (gradient.shape[0] != n) {
    return Status::Invalid(str_cat(
        kOp, ": gradient has ", gradient.shape[0], " rows but indices has ", n,
        " entries (gradient ", gradient.shape_string(), ", indices ", indices.shape_string(), ")"));
  }
  if (m.shape[0] != v.shape[0] || m.shape[0] != var.shape[0] || m.shape[1] != v.shape[1] ||
      m.shape[1] != var.shape[1]) {
    return Status::Invalid(str_cat(kOp, ": inputM ", m.shape_string(), ", inputV ",
                                   v.shape_string(), " and inputVar ", var.shape_string(),
                                   " must have the same shape"));
  }
  if (gradient.shape[1] != m.shape[1]) {
    return Status::Invalid(str_cat(kOp, ": gradient has ", gradient.shape[1],
                                   " columns but the table has ", m.shape[1], " (gradient ",
                                   gradient.shape_string(), ", inputM ", m.shape_string(), ")"));
  }
  const int64_t rows = m.shape[0];
  if (n > int64_t{std::numeric_limits<uint32_t>::max()} ||
      rows >= int64_t{std::numeric_limits<uint32_t>::max()}) {
    return Status::Invalid(
        str_cat(kOp, ": ", n, " indices into ", rows,
                " rows exceeds this implementation's limit of 2^32 - 1 of each"));
  }
  // The rule of every fusekit optimizer: a beta is checked as the kernel uses it, in float32, so
  // that 1 - 1e-9 (which rounds to 1.0f and would freeze m or v) is refused.
  for (const auto &[value, name] : {std::pair{options.beta1, "beta1"}, {options.beta2, "beta2"}}) {
    if (!(value >= 0.0 && static_cast<float>(value) < 1.0f)) {
      return Status::Invalid(
          str_cat(kOp, ": ", name, " = ", value, " must be in [0, 1) in float32"));
    }
  }
  if (!(std::isfinite(options.epsilon) && options.epsilon > 0.0 &&
        static_cast<float>(options.epsilon) > 0.0f &&
        std::isfinite(static_cast<float>(options.epsilon)))) {
    return Status::Invalid(
        str_cat(kOp, ": epsilon = ", options.epsilon, " must be finite and > 0 in float32"));
  }
  LazyAdamProblem p;
  p.desc = {without_data(gradient), without_data(indices), without_data(m), without_data(v),
            without_data(var)};
  p.n = n;
  p.d = m.shape[1];
  p.rows = rows;
  p.beta1 = static_cast<float>(options.beta1);
  p.beta2 = static_cast<float>(options.beta2);
  p.epsilon = static_cast<float>(options.epsilon);
  *out = p;
  return Status::Ok();
}

Status LazyAdamProblem::check(const LazyAdamTensors &t) const {
  const TensorView *planned[5] = {&desc.gradient, &desc.indices, &desc.m, &desc.v, &desc.var};
  const TensorView *bound[5] = {&t.gradient, &t.indices, &t.m, &t.v, &t.var};
  return check_bound_tensors(kOp, kRoles, planned, bound);
}

std::vector<std::string> LazyAdam::implementations() {
  return implementation_names(lazy_adam_impls());
}

Status LazyAdam::plan(const LazyAdamProblem &problem, const LazyAdamOptions &options,
                      LazyAdam *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  LazyAdam p;
  FUSEKIT_RETURN_IF_ERROR(choose_implementation(kOp, lazy_adam_impls(), problem, options.kernel,
                                                options.implementation, &p.impl_));
  p.problem_ = problem;
  p.threads_ = std::max(1, options.num_threads > 0 ? options.num_threads : num_threads());
  p.workspace_bytes_ = p.impl_->workspace_bytes(problem, p.threads_);
  *out = p;
  return Status::Ok();
}

Status LazyAdam::plan(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, const LazyAdamOptions &options,
                      LazyAdam *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const LazyAdamTensors tensors{gradient, indices, m, v, var};
  LazyAdamProblem problem;
  FUSEKIT_RETURN_IF_ERROR(LazyAdamProblem::make(tensors, options, &problem));
  FUSEKIT_RETURN_IF_ERROR(problem.check(tensors));
  LazyAdam p;
  FUSEKIT_RETURN_IF_ERROR(plan(problem, options, &p));
  p.bound_ = tensors;
  p.has_bound_ = true;
  *out = p;
  return Status::Ok();
}

const char *LazyAdam::implementation() const {
  return impl_ != nullptr ? impl_->name : "none";
}

Status LazyAdam::run(const LazyAdamTensors &tensors, const LazyAdamScalars &scalars,
                     void *workspace, size_t workspace_size, LazyAdamStats *stats,
                     StreamHandle stream) const {
  LazyAdamStats local;
  LazyAdamStats &st = stats != nullptr ? *stats : local;
  st = LazyAdamStats();
  if (impl_ == nullptr) return Status::Invalid(str_cat(kOp, ": run on a plan that was not made"));
  FUSEKIT_RETURN_IF_ERROR(problem_.check(tensors));
  LazyAdamScalars s = scalars;
  FUSEKIT_RETURN_IF_ERROR(read_scalar_tensor(kOp, "lr", s.lr_tensor, DType::kFloat32, &s.lr));
  if (!std::isfinite(s.lr)) return Status::Invalid(str_cat(kOp, ": lr = ", s.lr, " is not finite"));
  StageTimer timer;
  RunContext ctx;
  FUSEKIT_RETURN_IF_ERROR(make_run_context(kOp, workspace, workspace_size, workspace_bytes_,
                                           threads_, stream, &timer, &ctx));
  FUSEKIT_RETURN_IF_ERROR(impl_->run(problem_, tensors, s, ctx, &st));
  if (timer.on()) {
    verbose_print(str_cat(kOp, ",N=", problem_.n, ",R=", problem_.rows, ",D=", problem_.d,
                          ",index=", dtype_name(problem_.desc.indices.dtype), ",impl=", impl_->name,
                          ",isa=", impl_->target(), ",threads=", threads_,
                          ",rows=", st.rows_updated, ",skipped=", st.rows_skipped_nonfinite, ",",
                          timer.fields()));
  }
  return Status::Ok();
}

Status LazyAdam::run(float lr, void *workspace, size_t workspace_size, LazyAdamStats *stats) const {
  if (!has_bound_) {
    if (stats != nullptr) *stats = LazyAdamStats();
    return Status::Invalid(
        str_cat(kOp, ": run(lr, ...) needs a plan made from tensors; pass the tensors to run()"));
  }
  LazyAdamScalars s;
  s.lr = lr;
  return run(bound_, s, workspace, workspace_size, stats);
}

Status lazy_adam_step(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, float lr,
                      const LazyAdamOptions &options, LazyAdamStats *stats) {
  LazyAdam plan;
  FUSEKIT_RETURN_IF_ERROR(LazyAdam::plan(gradient, indices, m, v, var, options, &plan));
  return with_own_workspace(kOp, plan.workspace_size(), [&](void *workspace) {
    return plan.run(lr, workspace, plan.workspace_size(), stats);
  });
}

}  // namespace fusekit
