// EmbeddingBagLazyAdam, the C++ API: the problem (the table, the dtypes, the attributes) is
// validated once; a plan picks an implementation; each run binds the tensors of one batch (any B
// and L: the batch-sized dimensions are bound per run, XNNPACK's reshape), then runs the
// implementation (whose stages do the per-step data work: embedding_bag_lazy_adam_cpu.cc).
#include <limits>
#include <utility>

#include "common/adam_update.h"
#include "common/embedding_bags.h"
#include "common/plan.h"
#include "common/row_groups.h"
#include "common/str_cat.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"
#include "fusekit/embedding_bag_lazy_adam.h"

namespace fusekit {
namespace {

using Op = EmbeddingBagLazyAdamOp;
constexpr const char *kOp = "EmbeddingBagLazyAdam";

}  // namespace

Status EmbeddingBagLazyAdamProblem::make(const EmbeddingBagLazyAdamTensors &t,
                                         const EmbeddingBagLazyAdamOptions &options,
                                         EmbeddingBagLazyAdamProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  for (const auto &[x, name] : {std::pair{&t.m, "m"}, {&t.v, "v"}, {&t.var, "var"}}) {
    FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, *x, name));
    // The tables are written: two of their rows must not share elements.
    if (x->shape[0] > 1 && x->shape[1] > 0 && x->strides[0] < x->shape[1]) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has row stride ", x->strides[0], " < ",
                                     x->shape[1], " columns: its rows overlap"));
    }
  }
  const TensorView &m = t.m, &v = t.v, &var = t.var;
  if (m.shape[0] != v.shape[0] || m.shape[0] != var.shape[0] || m.shape[1] != v.shape[1] ||
      m.shape[1] != var.shape[1]) {
    return Status::Invalid(str_cat(kOp, ": m ", m.shape_string(), ", v ", v.shape_string(),
                                   " and var ", var.shape_string(), " must have the same shape"));
  }
  bool weighted = false;
  FUSEKIT_RETURN_IF_ERROR(check_bag_inputs(kOp, t.grad_output, t.indices, t.offsets,
                                           t.per_sample_weights, options.pooling, var.shape[0],
                                           var.shape[1], &weighted));
  EmbeddingBagLazyAdamProblem p;
  FUSEKIT_RETURN_IF_ERROR(check_lazy_adam_attributes(
      kOp, options.beta1, options.beta2, options.epsilon, &p.beta1, &p.beta2, &p.epsilon));
  p.desc = without_data<Op>(t);
  p.d = m.shape[1];
  p.rows = m.shape[0];
  p.weighted = weighted;
  p.pooling = options.pooling;
  *out = p;
  return Status::Ok();
}

Status EmbeddingBagLazyAdamProblem::check(const EmbeddingBagLazyAdamTensors &t) const {
  // The planned layouts with this batch's sizes and strides in the batch dimension: the generic
  // check then compares dtypes, ranks, the table layouts and D, and checks data, alignment and
  // overlap.
  FUSEKIT_RETURN_IF_ERROR(check_bound<Op>(bag_batch_desc(desc, t), t));
  return check_bag_batch(kOp, t.grad_output, t.indices, t.offsets, t.per_sample_weights, weighted);
}

std::string EmbeddingBagLazyAdamOp::problem_fields(const EmbeddingBagLazyAdamProblem &p,
                                                   const EmbeddingBagLazyAdamTensors &t) {
  return str_cat("B=", t.grad_output.shape[0], ",L=", t.indices.shape[0], ",R=", p.rows, ",D=", p.d,
                 ",pooling=", p.pooling == PoolingMode::kMean ? "mean" : "sum",
                 ",weighted=", p.weighted ? 1 : 0, ",index=", dtype_name(p.desc.indices.dtype));
}
std::string EmbeddingBagLazyAdamOp::result_fields(const EmbeddingBagLazyAdamStats &st) {
  return str_cat("rows=", st.rows_updated, ",skipped=", st.rows_skipped_nonfinite);
}

std::vector<std::string> EmbeddingBagLazyAdam::implementations() {
  return implementation_names<Op>();
}

Status EmbeddingBagLazyAdam::plan(const EmbeddingBagLazyAdamProblem &problem,
                                  const EmbeddingBagLazyAdamOptions &options,
                                  EmbeddingBagLazyAdam *out) {
  return make_plan<Op>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status EmbeddingBagLazyAdam::plan(const EmbeddingBagLazyAdamTensors &tensors,
                                  const EmbeddingBagLazyAdamOptions &options,
                                  EmbeddingBagLazyAdam *out) {
  return make_bound_plan<Op>(tensors, options, out != nullptr ? &out->state_ : nullptr);
}

size_t EmbeddingBagLazyAdam::workspace_size(const EmbeddingBagLazyAdamTensors &tensors) const {
  return run_workspace_bytes<Op>(state_, tensors);
}

size_t EmbeddingBagLazyAdam::workspace_size(int64_t bags, int64_t lookups) const {
  return bag_batch_workspace_bytes<Op>(state_, bags, lookups);
}

Status EmbeddingBagLazyAdam::run(const EmbeddingBagLazyAdamTensors &tensors,
                                 const EmbeddingBagLazyAdamScalars &scalars, void *workspace,
                                 size_t workspace_size, EmbeddingBagLazyAdamStats *stats,
                                 StreamHandle stream) const {
  return run_plan<Op>(state_, tensors, scalars, workspace, workspace_size, stats, stream);
}

Status EmbeddingBagLazyAdam::run(float lr, void *workspace, size_t workspace_size,
                                 EmbeddingBagLazyAdamStats *stats) const {
  EmbeddingBagLazyAdamScalars s;
  s.lr = lr;
  return run_bound<Op>(state_, s, workspace, workspace_size, stats, "run(lr, ...)");
}

Status embedding_bag_lazy_adam_step(const EmbeddingBagLazyAdamTensors &tensors, float lr,
                                    const EmbeddingBagLazyAdamOptions &options,
                                    EmbeddingBagLazyAdamStats *stats) {
  EmbeddingBagLazyAdamScalars s;
  s.lr = lr;
  return run_once<Op>(tensors, options, s, stats);
}

}  // namespace fusekit
