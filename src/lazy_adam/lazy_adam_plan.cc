// LazyAdam, the C++ API: the problem is validated once, a plan picks an implementation from the
// list and books its workspace, and each run binds tensors and scalars, then runs the
// implementation (whose stages do the per-step data work: lazy_adam_cpu.cc).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "common/adam_update.h"
#include "common/plan.h"
#include "common/row_groups.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/threading.h"
#include "lazy_adam/lazy_adam_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "LazyAdam";

}  // namespace

Status LazyAdamProblem::make(const LazyAdamTensors &t, const LazyAdamOptions &options,
                             LazyAdamProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &gradient = t.gradient, &indices = t.indices, &m = t.m, &v = t.v, &var = t.var;
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, gradient, "gradient"));
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, m, "inputM"));
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, v, "inputV"));
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, var, "inputVar"));
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
  LazyAdamProblem p;
  FUSEKIT_RETURN_IF_ERROR(check_lazy_adam_attributes(
      kOp, options.beta1, options.beta2, options.epsilon, &p.beta1, &p.beta2, &p.epsilon));
  p.desc = without_data<LazyAdamOp>(t);
  p.n = n;
  p.d = m.shape[1];
  p.rows = rows;
  *out = p;
  return Status::Ok();
}

Status LazyAdamProblem::check(const LazyAdamTensors &t) const {
  return check_bound<LazyAdamOp>(desc, t);
}

std::string LazyAdamOp::problem_fields(const LazyAdamProblem &p, const LazyAdamTensors & /*t*/) {
  return str_cat("N=", p.n, ",R=", p.rows, ",D=", p.d, ",index=", dtype_name(p.desc.indices.dtype));
}
std::string LazyAdamOp::result_fields(const LazyAdamStats &st) {
  return str_cat("rows=", st.rows_updated, ",skipped=", st.rows_skipped_nonfinite);
}

std::vector<std::string> LazyAdam::implementations() {
  return implementation_names<LazyAdamOp>();
}

Status LazyAdam::plan(const LazyAdamProblem &problem, const LazyAdamOptions &options,
                      LazyAdam *out) {
  return make_plan<LazyAdamOp>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status LazyAdam::plan(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, const LazyAdamOptions &options,
                      LazyAdam *out) {
  return make_bound_plan<LazyAdamOp>({gradient, indices, m, v, var}, options,
                                     out != nullptr ? &out->state_ : nullptr);
}

Status LazyAdam::run(const LazyAdamTensors &tensors, const LazyAdamScalars &scalars,
                     void *workspace, size_t workspace_size, LazyAdamStats *stats,
                     StreamHandle stream) const {
  return run_plan<LazyAdamOp>(state_, tensors, scalars, workspace, workspace_size, stats, stream);
}

Status LazyAdam::run(float lr, void *workspace, size_t workspace_size, LazyAdamStats *stats) const {
  LazyAdamScalars s;
  s.lr = lr;
  return run_bound<LazyAdamOp>(state_, s, workspace, workspace_size, stats, "run(lr, ...)");
}

Status lazy_adam_step(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, float lr,
                      const LazyAdamOptions &options, LazyAdamStats *stats) {
  LazyAdamScalars s;
  s.lr = lr;
  return run_once<LazyAdamOp>({gradient, indices, m, v, var}, options, s, stats);
}

}  // namespace fusekit
