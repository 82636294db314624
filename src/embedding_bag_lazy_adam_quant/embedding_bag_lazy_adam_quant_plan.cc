// EmbeddingBagLazyAdamQuant, the C++ API: the problem (the table and its 8-bit state, the dtypes,
// the attributes) is validated once, with the embedding-bag optimizers' checks of the batch
// tensors (common/embedding_bags.h) and LazyAdamQuant's of its state (check_laq_state,
// check_quant_state); a plan picks an implementation; each run binds the tensors of one batch (any
// B and L), then runs the implementation (embedding_bag_lazy_adam_quant_cpu.cc).
#include "common/adam_update.h"
#include "common/embedding_bags.h"
#include "common/plan.h"
#include "common/quant_run_tables.h"
#include "common/str_cat.h"
#include "embedding_bag_lazy_adam_quant/embedding_bag_lazy_adam_quant_impl.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

using Op = EmbeddingBagLazyAdamQuantOp;
constexpr const char *kOp = "EmbeddingBagLazyAdamQuant";

}  // namespace

Status EmbeddingBagLazyAdamQuantProblem::make(const EmbeddingBagLazyAdamQuantTensors &t,
                                              const EmbeddingBagLazyAdamQuantOptions &options,
                                              EmbeddingBagLazyAdamQuantProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  FUSEKIT_RETURN_IF_ERROR(check_laq_state(kOp, {"m", "v", "var", "absmax_m", "absmax_v"}, t.m, t.v,
                                          t.var, t.absmax_m, t.absmax_v));
  bool weighted = false;
  FUSEKIT_RETURN_IF_ERROR(check_bag_inputs(kOp, t.grad_output, t.indices, t.offsets,
                                           t.per_sample_weights, options.pooling, t.var.shape[0],
                                           t.var.shape[1], &weighted));
  EmbeddingBagLazyAdamQuantProblem p;
  FUSEKIT_RETURN_IF_ERROR(check_quant_state(kOp, options.state_format, options.guard_lost_v,
                                            t.qmap_m, t.qmap_v, &p.guard_lost_v));
  p.state_format = options.state_format;
  FUSEKIT_RETURN_IF_ERROR(check_lazy_adam_attributes(
      kOp, options.beta1, options.beta2, options.epsilon, &p.beta1, &p.beta2, &p.epsilon));
  p.desc = without_data<Op>(t);
  p.d = t.var.shape[1];
  p.rows = t.var.shape[0];
  p.blocks = (p.d + kLazyAdamQuantBlockSize - 1) / kLazyAdamQuantBlockSize;
  p.weighted = weighted;
  p.pooling = options.pooling;
  *out = p;
  return Status::Ok();
}

Status EmbeddingBagLazyAdamQuantProblem::check(const EmbeddingBagLazyAdamQuantTensors &t) const {
  // The planned layouts with this batch's sizes and strides in the batch dimension.
  FUSEKIT_RETURN_IF_ERROR(check_bound<Op>(bag_batch_desc(desc, t), t));
  return check_bag_batch(kOp, t.grad_output, t.indices, t.offsets, t.per_sample_weights, weighted);
}

std::string EmbeddingBagLazyAdamQuantOp::problem_fields(const EmbeddingBagLazyAdamQuantProblem &p,
                                                        const EmbeddingBagLazyAdamQuantTensors &t) {
  return str_cat("B=", t.grad_output.shape[0], ",L=", t.indices.shape[0], ",R=", p.rows, ",D=", p.d,
                 ",dtype=", dtype_name(p.desc.var.dtype),
                 ",pooling=", p.pooling == PoolingMode::kMean ? "mean" : "sum",
                 ",weighted=", p.weighted ? 1 : 0, ",index=", dtype_name(p.desc.indices.dtype),
                 ",state=", quant_state_format_name(p.state_format),
                 p.guard_lost_v ? ",guard_lost_v" : "");
}
std::string EmbeddingBagLazyAdamQuantOp::result_fields(const EmbeddingBagLazyAdamQuantStats &st) {
  return str_cat("rows=", st.rows_updated, ",skipped=", st.rows_skipped_nonfinite);
}

std::vector<std::string> EmbeddingBagLazyAdamQuant::implementations() {
  return implementation_names<Op>();
}

Status EmbeddingBagLazyAdamQuant::plan(const EmbeddingBagLazyAdamQuantProblem &problem,
                                       const EmbeddingBagLazyAdamQuantOptions &options,
                                       EmbeddingBagLazyAdamQuant *out) {
  return make_plan<Op>(problem, options, out != nullptr ? &out->state_ : nullptr);
}

Status EmbeddingBagLazyAdamQuant::plan(const EmbeddingBagLazyAdamQuantTensors &tensors,
                                       const EmbeddingBagLazyAdamQuantOptions &options,
                                       EmbeddingBagLazyAdamQuant *out) {
  return make_bound_plan<Op>(tensors, options, out != nullptr ? &out->state_ : nullptr);
}

size_t EmbeddingBagLazyAdamQuant::workspace_size(
    const EmbeddingBagLazyAdamQuantTensors &tensors) const {
  return run_workspace_bytes<Op>(state_, tensors);
}

size_t EmbeddingBagLazyAdamQuant::workspace_size(int64_t bags, int64_t lookups) const {
  return bag_batch_workspace_bytes<Op>(state_, bags, lookups);
}

Status EmbeddingBagLazyAdamQuant::run(const EmbeddingBagLazyAdamQuantTensors &tensors,
                                      const EmbeddingBagLazyAdamQuantScalars &scalars,
                                      void *workspace, size_t workspace_size,
                                      EmbeddingBagLazyAdamQuantStats *stats,
                                      StreamHandle stream) const {
  return run_plan<Op>(state_, tensors, scalars, workspace, workspace_size, stats, stream);
}

Status EmbeddingBagLazyAdamQuant::run(float lr, void *workspace, size_t workspace_size,
                                      EmbeddingBagLazyAdamQuantStats *stats) const {
  EmbeddingBagLazyAdamQuantScalars s;
  s.lr = lr;
  return run_bound<Op>(state_, s, workspace, workspace_size, stats, "run(lr, ...)");
}

Status embedding_bag_lazy_adam_quant_step(const EmbeddingBagLazyAdamQuantTensors &tensors, float lr,
                                          const EmbeddingBagLazyAdamQuantOptions &options,
                                          EmbeddingBagLazyAdamQuantStats *stats) {
  EmbeddingBagLazyAdamQuantScalars s;
  s.lr = lr;
  return run_once<Op>(tensors, options, s, stats);
}

}  // namespace fusekit
