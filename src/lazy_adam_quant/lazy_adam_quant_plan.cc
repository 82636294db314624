// LazyAdamQuant, the C++ API: the problem is validated once, a plan picks an implementation from
// the list and books its workspace, and each run binds tensors and lr, then runs the
// implementation (whose stages do the per-step data work: lazy_adam_quant_cpu.cc).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "common/adam_update.h"
#include "common/plan.h"
#include "common/quant_run_tables.h"
#include "common/row_groups.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/lazy_adam_quant.h"
#include "fusekit/threading.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "LazyAdamQuant";

Status check_matrix(const char *op, const TensorView &t, const char *name, bool written) {
  if (t.ndim != 2) {
    return Status::Invalid(str_cat(op, ": ", name, " must be 2-D, got shape ", t.shape_string()));
  }
  if (t.shape[0] < 0 || t.shape[1] < 0) {
    return Status::Invalid(
        str_cat(op, ": ", name, " has a negative size in shape ", t.shape_string()));
  }
  if (!t.inner_contiguous()) {
    return Status::Invalid(str_cat(op, ": ", name,
                                   " must have a contiguous last dimension, got strides [",
                                   t.strides[0], ", ", t.strides[1], "]"));
  }
  if (t.strides[0] < 0) {
    return Status::Invalid(str_cat(op, ": ", name, " has a negative row stride ", t.strides[0]));
  }
  if (row_table_span_overflows(t)) {  // (a one-row table may have any row stride)
    return Status::Invalid(
        str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  if (written && t.shape[0] > 1 && t.shape[1] > 0 && t.strides[0] < t.shape[1]) {
    return Status::Invalid(str_cat(op, ": ", name, " has row stride ", t.strides[0], " < ",
                                   t.shape[1], " columns: its rows overlap"));
  }
  return Status::Ok();
}

}  // namespace

Status check_laq_state(const char *op, const LaqStateNames &n, const TensorView &m,
                       const TensorView &v, const TensorView &var, const TensorView &absmax_m,
                       const TensorView &absmax_v) {
  if (!is_float_type(var.dtype)) {
    return Status::Invalid(str_cat(op, ": ", n.var, " has dtype ", dtype_name(var.dtype),
                                   "; float32, float16 or bfloat16 is required"));
  }
  for (const auto &[x, name] : {std::pair{&m, n.m}, std::pair{&v, n.v}}) {
    if (x->dtype != DType::kUInt8) {
      return Status::Invalid(
          str_cat(op, ": ", name, " has dtype ", dtype_name(x->dtype), "; uint8 is required"));
    }
  }
  FUSEKIT_RETURN_IF_ERROR(check_matrix(op, m, n.m, true));
  FUSEKIT_RETURN_IF_ERROR(check_matrix(op, v, n.v, true));
  FUSEKIT_RETURN_IF_ERROR(check_matrix(op, var, n.var, true));
  if (m.shape[0] != var.shape[0] || m.shape[1] != var.shape[1] || v.shape[0] != var.shape[0] ||
      v.shape[1] != var.shape[1]) {
    return Status::Invalid(str_cat(op, ": ", n.m, " ", m.shape_string(), ", ", n.v, " ",
                                   v.shape_string(), " and ", n.var, " ", var.shape_string(),
                                   " must have the same shape"));
  }
  const int64_t rows = var.shape[0], d = var.shape[1];
  const int64_t blocks = (d + kLazyAdamQuantBlockSize - 1) / kLazyAdamQuantBlockSize;
  for (const auto &[x, name] :
       {std::pair{&absmax_m, n.absmax_m}, std::pair{&absmax_v, n.absmax_v}}) {
    if (x->dtype != DType::kFloat32 || x->ndim != 2 || x->shape[0] != rows ||
        x->shape[1] != blocks) {
      return Status::Invalid(str_cat(
          op, ": ", name, " must be float32 [", rows, ", ", blocks, "] (a row per table row, ceil(",
          d, " / 256) blocks per row), got ", dtype_name(x->dtype), " ", x->shape_string()));
    }
    FUSEKIT_RETURN_IF_ERROR(check_matrix(op, *x, name, true));
  }
  return Status::Ok();
}

Status LazyAdamQuantProblem::make(const LazyAdamQuantTensors &t,
                                  const LazyAdamQuantOptions &options, LazyAdamQuantProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &var = t.var, &grad = t.gradient, &m = t.m, &v = t.v, &indices = t.indices;
  FUSEKIT_RETURN_IF_ERROR(check_laq_state(kOp,
                                          {"inputM", "inputV", "inputVar", "absmaxM", "absmaxV"}, m,
                                          v, var, t.absmax_m, t.absmax_v));
  if (grad.dtype != var.dtype && grad.dtype != DType::kFloat32) {
    return Status::Invalid(str_cat(kOp, ": gradient has dtype ", dtype_name(grad.dtype),
                                   " but inputVar has ", dtype_name(var.dtype),
                                   "; the gradient must be inputVar's dtype or float32"));
  }
  FUSEKIT_RETURN_IF_ERROR(check_matrix(kOp, grad, "gradient", false));
  if (indices.dtype != DType::kInt32 && indices.dtype != DType::kInt64) {
    return Status::Invalid(str_cat(kOp, ": indices has dtype ", dtype_name(indices.dtype),
                                   "; int32 or int64 is required"));
  }
  if (!(indices.ndim == 1 || (indices.ndim == 2 && indices.shape[1] == 1)) ||
      indices.shape[0] < 0) {
    return Status::Invalid(
        str_cat(kOp, ": indices must have shape [N] or [N, 1], got ", indices.shape_string()));
  }
  const int64_t n = indices.shape[0];
  if (grad.shape[0] != n) {
    return Status::Invalid(str_cat(kOp, ": gradient has ", grad.shape[0], " rows but indices has ",
                                   n, " entries (gradient ", grad.shape_string(), ", indices ",
                                   indices.shape_string(), ")"));
  }
  if (grad.shape[1] != var.shape[1]) {
    return Status::Invalid(str_cat(kOp, ": gradient has ", grad.shape[1],
                                   " columns but the table has ", var.shape[1], " (gradient ",
                                   grad.shape_string(), ", inputVar ", var.shape_string(), ")"));
  }
  const int64_t rows = var.shape[0], d = var.shape[1];
  if (n > int64_t{std::numeric_limits<uint32_t>::max()} ||
      rows >= int64_t{std::numeric_limits<uint32_t>::max()}) {
    return Status::Invalid(
        str_cat(kOp, ": ", n, " indices into ", rows,
                " rows exceeds this implementation's limit of 2^32 - 1 of each"));
  }
  const int64_t blocks = (d + kLazyAdamQuantBlockSize - 1) / kLazyAdamQuantBlockSize;
  LazyAdamQuantProblem p;
  FUSEKIT_RETURN_IF_ERROR(check_quant_state(kOp, options.state_format, options.guard_lost_v,
                                            t.qmap_m, t.qmap_v, &p.guard_lost_v));
  p.state_format = options.state_format;
  FUSEKIT_RETURN_IF_ERROR(check_lazy_adam_attributes(
      kOp, options.beta1, options.beta2, options.epsilon, &p.beta1, &p.beta2, &p.epsilon));
  p.desc = without_data<LazyAdamQuantOp>(t);
  p.n = n;
  p.d = d;
  p.rows = rows;
  p.blocks = blocks;
  *out = p;
  return Status::Ok();
}

Status LazyAdamQuantProblem::check(const LazyAdamQuantTensors &t) const {
  return check_bound<LazyAdamQuantOp>(desc, t);
}

std::string LazyAdamQuantOp::problem_fields(const LazyAdamQuantProblem &p,
                                            const LazyAdamQuantTensors & /*t*/) {
  return str_cat(
      "N=", p.n, ",R=", p.rows, ",D=", p.d, ",dtype=", dtype_name(p.desc.var.dtype),
      ",grad=", dtype_name(p.desc.gradient.dtype), ",index=", dtype_name(p.desc.indices.dtype),
      ",state=", quant_state_format_name(p.state_format), p.guard_lost_v ? ",guard_lost_v" : "");
}
std::string LazyAdamQuantOp::result_fields(const LazyAdamQuantStats &st) {
  return str_cat("rows=", st.rows_updated, ",skipped=", st.rows_skipped_nonfinite);
}

std::vector<std::string> LazyAdamQuant::implementations() {
  return implementation_names<LazyAdamQuantOp>();
}

Status LazyAdamQuant::plan(const LazyAdamQuantProblem &problem, const LazyAdamQuantOptions &options,
                           LazyAdamQuant *out) {
  return make_plan<LazyAdamQuantOp>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status LazyAdamQuant::plan(const LazyAdamQuantTensors &tensors, const LazyAdamQuantOptions &options,
                           LazyAdamQuant *out) {
  return make_bound_plan<LazyAdamQuantOp>(tensors, options,
                                          out != nullptr ? &out->state_ : nullptr);
}

Status LazyAdamQuant::run(const LazyAdamQuantTensors &tensors, const LazyAdamQuantScalars &scalars,
                          void *workspace, size_t workspace_size, LazyAdamQuantStats *stats,
                          StreamHandle stream) const {
  return run_plan<LazyAdamQuantOp>(state_, tensors, scalars, workspace, workspace_size, stats,
                                   stream);
}

Status LazyAdamQuant::run(float lr, void *workspace, size_t workspace_size,
                          LazyAdamQuantStats *stats) const {
  LazyAdamQuantScalars s;
  s.lr = lr;
  return run_bound<LazyAdamQuantOp>(state_, s, workspace, workspace_size, stats, "run(lr, ...)");
}

Status lazy_adam_quant_step(const LazyAdamQuantTensors &tensors, float lr,
                            const LazyAdamQuantOptions &options, LazyAdamQuantStats *stats) {
  LazyAdamQuantScalars s;
  s.lr = lr;
  return run_once<LazyAdamQuantOp>(tensors, options, s, stats);
}

}  // namespace fusekit
