// ApplyAdamWQuant, the C++ API: the problem is validated once, a plan picks an implementation from
// the list and books its workspace, and each run binds tensors and the step, then runs the
// implementation (whose stages do the per-step data work: apply_adam_w_quant_cpu.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"
#include "common/adam_update.h"
#include "common/plan.h"
#include "common/quant_run_tables.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/apply_adam_w_quant.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "ApplyAdamWQuant";
constexpr int64_t kBlock = kAdamWQuantBlockSize;

// A written view must not reach one element through two indices (a zero or interleaved stride).
bool self_overlapping(const TensorView &t) {
  std::pair<int64_t, int64_t> dims[TensorView::kMaxDims];
  int k = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1) dims[k++] = {t.strides[i] < 0 ? -t.strides[i] : t.strides[i], t.shape[i]};
  }
  for (int i = 1; i < k; ++i) {  // insertion sort by stride (at most 8 dimensions)
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t extent = 1;
  for (int i = 0; i < k; ++i) {
    if (dims[i].first < extent) return true;
    extent = dims[i].first * (dims[i].second - 1) + extent;
  }
  return false;
}

// The tensors by role, named as the aclnn call names them, in the order of ApplyAdamWQuantTensors:
// var, m, v and both absmax written in place; the maps read even when n = 0 (phase two checks
// them).
}  // namespace

Status ApplyAdamWQuantProblem::make(const ApplyAdamWQuantTensors &t,
                                    const ApplyAdamWQuantOptions &options,
                                    ApplyAdamWQuantProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  const TensorView &var = t.var, &grad = t.grad, &m = t.m, &v = t.v;
  FUSEKIT_RETURN_IF_ERROR(check_var_grad_dtypes(kOp, "varRef", var, "grad", grad));
  if (m.dtype != DType::kUInt8)
    return Status::Invalid(
        str_cat(kOp, ": mRef has dtype ", dtype_name(m.dtype), "; uint8 is required"));
  if (v.dtype != DType::kUInt8)
    return Status::Invalid(
        str_cat(kOp, ": vRef has dtype ", dtype_name(v.dtype), "; uint8 is required"));
  if (var.ndim < 1 || var.ndim > 8) {
    return Status::Invalid(str_cat(kOp, ": varRef has ", var.ndim, " dimensions ",
                                   var.shape_string(), "; 1 to 8 are supported"));
  }
  const std::pair<const TensorView *, const char *> same[] = {
      {&grad, "grad"}, {&m, "mRef"}, {&v, "vRef"}};
  for (const auto &[x, name] : same) {
    bool equal = x->ndim == var.ndim;
    for (int i = 0; equal && i < var.ndim; ++i) equal = x->shape[i] == var.shape[i];
    if (!equal) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has shape ", x->shape_string(),
                                     " but varRef has ", var.shape_string(), "; they must match"));
    }
  }
  int64_t n = 0, unused = 0;
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, var, "varRef", &n));
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, grad, "grad", &unused));
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, m, "mRef", &unused));
  FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, v, "vRef", &unused));
  if (options.block_size != kBlock) {
    return Status::Invalid(
        str_cat(kOp, ": blockSize = ", options.block_size, "; only 256 is supported"));
  }
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::pair<const TensorView *, const char *> scales[] = {{&t.absmax_m, "absmaxMRef"},
                                                                {&t.absmax_v, "absmaxVRef"}};
  for (const auto &[x, name] : scales) {
    if (x->dtype != DType::kFloat32 || x->ndim != 1 || x->shape[0] != blocks) {
      return Status::Invalid(str_cat(kOp, ": ", name, " must be float32 [", blocks, "] (ceil(", n,
                                     " / 256)), got ", dtype_name(x->dtype), " ",
                                     x->shape_string()));
    }
    FUSEKIT_RETURN_IF_ERROR(adam_checked_numel(kOp, *x, name, &unused));
  }
  bool guard_lost_v = false;
  FUSEKIT_RETURN_IF_ERROR(check_quant_state(kOp, options.state_format, options.guard_lost_v,
                                            t.qmap_m, t.qmap_v, &guard_lost_v,
                                            /*takes_ue3m5=*/true));
  AdamAttributes attr;
  FUSEKIT_RETURN_IF_ERROR(check_adam_attributes(kOp, options.beta1, options.beta2,
                                                options.weight_decay, options.eps,
                                                options.gnorm_scale, &attr));
  // In-place outputs: no element reachable twice.
  const std::pair<const TensorView *, const char *> outs[] = {{&var, "varRef"},
                                                              {&m, "mRef"},
                                                              {&v, "vRef"},
                                                              {&t.absmax_m, "absmaxMRef"},
                                                              {&t.absmax_v, "absmaxVRef"}};
  for (const auto &[x, name] : outs) {
    if (self_overlapping(*x)) {
      return Status::Invalid(str_cat(kOp, ": ", name, " of shape ", x->shape_string(),
                                     " and strides ", x->strides_string(),
                                     " reaches some elements twice; an in-place tensor must not"));
    }
  }
  ApplyAdamWQuantProblem p;
  p.desc = without_data<ApplyAdamWQuantOp>(t);
  p.n = n;
  p.blocks = blocks;
  p.contiguous =
      var.is_contiguous() && grad.is_contiguous() && m.is_contiguous() && v.is_contiguous();
  set_adam_attributes(attr, &p);
  p.state_format = options.state_format;
  p.guard_lost_v = guard_lost_v;
  *out = p;
  return Status::Ok();
}

Status ApplyAdamWQuantProblem::check(const ApplyAdamWQuantTensors &t) const {
  return check_bound<ApplyAdamWQuantOp>(desc, t);
}

std::string ApplyAdamWQuantOp::problem_fields(const ApplyAdamWQuantProblem &p,
                                              const ApplyAdamWQuantTensors & /*t*/) {
  return str_cat("n=", p.n, ",blocks=", p.blocks, ",dtype=", dtype_name(p.desc.var.dtype),
                 ",layout=", p.contiguous ? "contiguous" : "strided",
                 ",state=", quant_state_format_name(p.state_format),
                 p.guard_lost_v ? ",guard_lost_v" : "");
}
std::string ApplyAdamWQuantOp::result_fields(const ApplyAdamWQuantStats &st) {
  return str_cat("skipped=", st.blocks_skipped_nonfinite);
}

std::vector<std::string> ApplyAdamWQuant::implementations() {
  return implementation_names<ApplyAdamWQuantOp>();
}

Status ApplyAdamWQuant::plan(const ApplyAdamWQuantProblem &problem,
                             const ApplyAdamWQuantOptions &options, ApplyAdamWQuant *out) {
  return make_plan<ApplyAdamWQuantOp>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status ApplyAdamWQuant::plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                             const TensorView &v, const TensorView &qmap_m,
                             const TensorView &qmap_v, const TensorView &absmax_m,
                             const TensorView &absmax_v, const ApplyAdamWQuantOptions &options,
                             ApplyAdamWQuant *out) {
  return make_bound_plan<ApplyAdamWQuantOp>({var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v},
                                            options, out != nullptr ? &out->state_ : nullptr);
}

Status ApplyAdamWQuant::run(const ApplyAdamWQuantTensors &tensors,
                            const ApplyAdamWQuantScalars &scalars, void *workspace,
                            size_t workspace_size, ApplyAdamWQuantStats *stats,
                            StreamHandle stream) const {
  return run_plan<ApplyAdamWQuantOp>(state_, tensors, scalars, workspace, workspace_size, stats,
                                     stream);
}

Status ApplyAdamWQuant::run(int64_t step, float lr, void *workspace, size_t workspace_size,
                            ApplyAdamWQuantStats *stats) const {
  ApplyAdamWQuantScalars s;
  s.step = step;
  s.lr = lr;
  return run_bound<ApplyAdamWQuantOp>(state_, s, workspace, workspace_size, stats,
                                      "run(step, lr, ...)");
}

Status apply_adam_w_quant_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                               const TensorView &v, const TensorView &qmap_m,
                               const TensorView &qmap_v, const TensorView &absmax_m,
                               const TensorView &absmax_v, int64_t step, float lr,
                               const ApplyAdamWQuantOptions &options, ApplyAdamWQuantStats *stats) {
  ApplyAdamWQuantScalars s;
  s.step = step;
  s.lr = lr;
  return run_once<ApplyAdamWQuantOp>({var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v}, options,
                                     s, stats);
}

}  // namespace fusekit
