// EmbeddingBagLazyAdam, the C++ API: the problem (the table, the dtypes, the attributes) is
// validated once; a plan picks an implementation; each run binds the tensors of one batch (any B
// and L: the batch-sized dimensions are bound per run, XNNPACK's reshape), then runs the
// implementation (whose stages do the per-step data work: embedding_bag_lazy_adam_cpu.cc).
#include <limits>
#include <utility>

#include "common/adam_update.h"
#include "common/plan.h"
#include "common/row_groups.h"
#include "common/str_cat.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"
#include "fusekit/embedding_bag_lazy_adam.h"

namespace fusekit {
namespace {

using Op = EmbeddingBagLazyAdamOp;
constexpr const char *kOp = "EmbeddingBagLazyAdam";
// Lookups and bags are numbered in 32 bits (the entries pack row and lookup; the bag of a lookup is
// a uint32).
constexpr int64_t kMaxBatch = int64_t{std::numeric_limits<uint32_t>::max()};

// A 1-D batch tensor (indices, offsets, per_sample_weights) of one of the dtypes named.
Status check_vector(const TensorView &t, const char *name, std::initializer_list<DType> dtypes,
                    const char *dtypes_text) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || t.dtype == d;
  if (!dtype_ok) {
    return Status::Invalid(str_cat(kOp, ": ", name, " has dtype ", dtype_name(t.dtype), "; ",
                                   dtypes_text, " is required"));
  }
  if (t.ndim != 1) {
    return Status::Invalid(str_cat(kOp, ": ", name, " must be 1-D, got shape ", t.shape_string()));
  }
  return Status::Ok();
}

// The batch's own rules, checked on every run (the shapes change from batch to batch): sizes, the
// relations between the batch tensors, strides that can be walked.
Status check_batch(const EmbeddingBagLazyAdamTensors &t, bool weighted) {
  const int64_t b = t.grad_output.shape[0], l = t.indices.shape[0];
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, t.grad_output, "grad_output"));
  if (l < 0 || t.offsets.shape[0] < 0) {
    return Status::Invalid(str_cat(kOp, ": indices ", t.indices.shape_string(), " or offsets ",
                                   t.offsets.shape_string(), " has a negative size"));
  }
  if (t.offsets.shape[0] != b + 1) {
    return Status::Invalid(
        str_cat(kOp, ": offsets has ", t.offsets.shape[0], " entries but grad_output has ", b,
                " bags: offsets must have B + 1 = ", b + 1,
                " (TorchRec's form, the last one the number of lookups; nn.EmbeddingBag's offsets "
                "need L appended)"));
  }
  if (weighted && t.per_sample_weights.shape[0] != l) {
    return Status::Invalid(str_cat(kOp, ": per_sample_weights has ", t.per_sample_weights.shape[0],
                                   " entries but indices has ", l,
                                   "; one weight per lookup is required"));
  }
  if (l > kMaxBatch || b >= kMaxBatch) {
    return Status::Invalid(
        str_cat(kOp, ": ", l, " lookups in ", b,
                " bags exceeds this implementation's limit of 2^32 - 1 of each"));
  }
  for (const auto &[v, name] : {std::pair{&t.indices, "indices"},
                                {&t.offsets, "offsets"},
                                {&t.per_sample_weights, "per_sample_weights"}}) {
    if (v->ndim == 1 && v->shape[0] > 1 && v->strides[0] < 0) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has a negative stride ", v->strides[0]));
    }
    int64_t span = 0;
    if (v->ndim == 1 && v->shape[0] > 0 &&
        __builtin_mul_overflow(v->shape[0], std::max<int64_t>(v->strides[0], 1), &span)) {
      return Status::Invalid(
          str_cat(kOp, ": ", name, " of shape ", v->shape_string(), " overflows 64-bit sizes"));
    }
  }
  return Status::Ok();
}

}  // namespace

Status EmbeddingBagLazyAdamProblem::make(const EmbeddingBagLazyAdamTensors &t,
                                         const EmbeddingBagLazyAdamOptions &options,
                                         EmbeddingBagLazyAdamProblem *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(kOp, t.grad_output, "grad_output"));
  FUSEKIT_RETURN_IF_ERROR(
      check_vector(t.indices, "indices", {DType::kInt32, DType::kInt64}, "int32 or int64"));
  FUSEKIT_RETURN_IF_ERROR(
      check_vector(t.offsets, "offsets", {DType::kInt32, DType::kInt64}, "int32 or int64"));
  const bool weighted = !t.per_sample_weights.empty_view();
  if (weighted) {
    FUSEKIT_RETURN_IF_ERROR(
        check_vector(t.per_sample_weights, "per_sample_weights", {DType::kFloat32}, "float32"));
  }
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
  if (t.grad_output.shape[1] != m.shape[1]) {
    return Status::Invalid(str_cat(kOp, ": grad_output has ", t.grad_output.shape[1],
                                   " columns but the table has ", m.shape[1], " (grad_output ",
                                   t.grad_output.shape_string(), ", var ", var.shape_string(),
                                   ")"));
  }
  if (m.shape[0] >= kMaxBatch) {
    return Status::Invalid(str_cat(kOp, ": a table of ", m.shape[0],
                                   " rows exceeds this implementation's limit of 2^32 - 2"));
  }
  if (options.pooling != PoolingMode::kSum && options.pooling != PoolingMode::kMean) {
    return Status::Invalid(str_cat(kOp, ": pooling = ", static_cast<int>(options.pooling),
                                   " is not a pooling mode (sum 0, mean 1)"));
  }
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
  EmbeddingBagLazyAdamTensors expected = desc;
  const auto take_batch = [](TensorView &e, const TensorView &b) {
    if (e.ndim >= 1 && b.ndim == e.ndim) {
      e.shape[0] = b.shape[0];
      e.strides[0] = b.strides[0];
    }
  };
  take_batch(expected.grad_output, t.grad_output);
  take_batch(expected.indices, t.indices);
  take_batch(expected.offsets, t.offsets);
  take_batch(expected.per_sample_weights, t.per_sample_weights);
  FUSEKIT_RETURN_IF_ERROR(check_bound<Op>(expected, t));
  return check_batch(t, weighted);
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
  EmbeddingBagLazyAdamTensors t = state_.problem.desc;
  t.grad_output.shape[0] = bags;
  t.indices.shape[0] = lookups;
  t.offsets.shape[0] = bags + 1;
  if (state_.problem.weighted) t.per_sample_weights.shape[0] = lookups;
  return run_workspace_bytes<Op>(state_, t);
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
