// AddLora, the C++ API: the problem is validated once, a plan picks an implementation from the
// list and books its workspace, and each run binds the tensors, then runs the implementation
// (whose stages do the per-step data work: check, group, copy, compute; add_lora_cpu.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "add_lora/add_lora_impl.h"
#include "common/plan.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/add_lora.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "AddLora";

// Every tensor: the expected rank, positive sizes, a contiguous innermost dimension (unless
// any_stride), non-negative strides, and an extent that fits 64-bit arithmetic. The data pointer is
// not looked at.
Status check_tensor(const TensorView &t, const char *name, int ndim, const char *shape_name,
                    bool any_stride = false) {
  if (t.ndim != ndim) {
    return Status::ShapeMismatch(str_cat(kOp, ": ", name, " must be ", ndim, "-D ", shape_name,
                                         ", got shape ", t.shape_string()));
  }
  for (int i = 0; i < ndim; ++i) {
    if (t.shape[i] <= 0) {
      return Status::ShapeMismatch(
          str_cat(kOp, ": ", name, " has shape ", t.shape_string(),
                  "; every size must be positive (empty tensors are not supported)"));
    }
    if (t.strides[i] < 0) {
      return Status::Invalid(
          str_cat(kOp, ": ", name, " has a negative stride ", t.strides[i], " in dimension ", i));
    }
  }
  if (!any_stride && !t.inner_contiguous()) {
    return Status::Invalid(str_cat(kOp, ": ", name,
                                   " must have a contiguous innermost dimension, got stride ",
                                   t.strides[ndim - 1]));
  }
  int64_t extent = 1;
  for (int i = 0; i < ndim; ++i) {
    int64_t span = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.strides[i], &span) ||
        __builtin_add_overflow(extent, span, &extent)) {
      return Status::Invalid(
          str_cat(kOp, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(
          extent, static_cast<int64_t>(dtype_size(t.dtype) == 0 ? 1 : dtype_size(t.dtype)),
          &bytes)) {
    return Status::Invalid(
        str_cat(kOp, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  return Status::Ok();
}

bool float_dtype(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32;
}

}  // namespace

Status AddLoraProblem::make(const AddLoraTensors &t, const AddLoraOptions &options,
                            AddLoraProblem *problem) {
  if (problem == nullptr) return Status::NullPointer(str_cat(kOp, ": problem is null"));
  const TensorView &y = t.y, &x = t.x, &weight_b = t.weight_b, &indices = t.indices,
                   &weight_a = t.weight_a, &out = t.out;
  const bool has_a = !weight_a.empty_view();
  // Dtypes first (161002), then ranks and shapes (561002, as CANN reports them for AddLora).
  for (const auto &[v, name] : {std::pair{&y, "y"},
                                {&x, "x"},
                                {&weight_b, "weightB"},
                                {&indices, "indices"},
                                {&out, "out"}}) {
    if (v->empty_view()) return Status::NullPointer(str_cat(kOp, ": ", name, " is null"));
  }
  if (!float_dtype(y.dtype)) {
    return Status::Invalid(str_cat(kOp, ": y has dtype ", dtype_name(y.dtype),
                                   "; float16, bfloat16 and float32 are supported"));
  }
  for (const auto &[v, name] : {std::pair{&x, "x"},
                                {&weight_b, "weightB"},
                                {&weight_a, "weightAOptional"},
                                {&out, "out"}}) {
    if (v == &weight_a && !has_a) continue;
    if (v->dtype != y.dtype) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has dtype ", dtype_name(v->dtype),
                                     " but y has ", dtype_name(y.dtype), "; they must match"));
    }
  }
  if (indices.dtype != DType::kInt32 && indices.dtype != DType::kInt64) {
    return Status::Invalid(str_cat(kOp, ": indices has dtype ", dtype_name(indices.dtype),
                                   "; int32 (CANN's) or int64 (torch's and vLLM's) is required"));
  }
  FUSEKIT_RETURN_IF_ERROR(check_tensor(y, "y", 2, "[B, H3]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(x, "x", 2, "[B, H1]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(weight_b, "weightB", 4, "[W, L, H2, R]"));
  // indices are read one by one (the check stage): any non-negative stride
  FUSEKIT_RETURN_IF_ERROR(check_tensor(indices, "indices", 1, "[B]", /*any_stride=*/true));
  if (has_a) FUSEKIT_RETURN_IF_ERROR(check_tensor(weight_a, "weightAOptional", 4, "[W, L, R, H1]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(out, "out", 2, "[B, H3]"));

  const int64_t b = y.shape[0], h3 = y.shape[1], h1 = x.shape[1];
  const int64_t w = weight_b.shape[0], l = weight_b.shape[1], h2 = weight_b.shape[2],
                r = weight_b.shape[3];
  if (x.shape[0] != b) {
    return Status::ShapeMismatch(str_cat(kOp, ": x has ", x.shape[0], " rows but y has ", b, " (x ",
                                         x.shape_string(), ", y ", y.shape_string(), ")"));
  }
  if (indices.shape[0] != b) {
    return Status::ShapeMismatch(
        str_cat(kOp, ": indices has ", indices.shape[0], " entries but y has ", b, " rows"));
  }
  if (out.shape[0] != b || out.shape[1] != h3) {
    return Status::ShapeMismatch(str_cat(kOp, ": out has shape ", out.shape_string(),
                                         " but y has shape ", y.shape_string(),
                                         "; they must match"));
  }
  if (has_a) {
    if (weight_a.shape[0] != w || weight_a.shape[1] != l) {
      return Status::ShapeMismatch(str_cat(kOp, ": weightAOptional ", weight_a.shape_string(),
                                           " and weightB ", weight_b.shape_string(),
                                           " must agree on [W, L]"));
    }
    if (weight_a.shape[2] != r) {
      return Status::ShapeMismatch(str_cat(kOp, ": weightAOptional has rank ", weight_a.shape[2],
                                           " but weightB has ", r, " (weightAOptional ",
                                           weight_a.shape_string(), ", weightB ",
                                           weight_b.shape_string(), ")"));
    }
    if (weight_a.shape[3] != h1) {
      return Status::ShapeMismatch(str_cat(kOp, ": weightAOptional has H1 = ", weight_a.shape[3],
                                           " but x has ", h1, " columns"));
    }
  } else if (h1 != r) {
    return Status::ShapeMismatch(str_cat(kOp, ": without weightAOptional x must have R = ", r,
                                         " columns (weightB's last dimension), got ", h1));
  }
  if (options.y_slice_size != -1 && options.y_slice_size != h2) {
    return Status::ShapeMismatch(str_cat(kOp, ": ySliceSize = ", options.y_slice_size,
                                         " must be -1 or H2 = ", h2,
                                         " (weightB's third dimension)"));
  }
  if (options.y_offset < 0 || options.y_offset > h3 - h2) {
    return Status::ShapeMismatch(str_cat(kOp, ": yOffset = ", options.y_offset, " with H2 = ", h2,
                                         " does not fit y's ", h3,
                                         " columns (need 0 <= yOffset <= ", h3 - h2, ")"));
  }
  if (options.layer_idx < 0 || options.layer_idx >= l) {
    return Status::ShapeMismatch(str_cat(kOp, ": layerIdx = ", options.layer_idx,
                                         " is outside [0, ", l, ") (weightB has ", l, " layers)"));
  }
  const float scale = static_cast<float>(options.scale);
  if (!std::isfinite(scale)) {
    return Status::Invalid(str_cat(kOp, ": scale = ", options.scale, " is not finite in float32"));
  }
  if (b >= int64_t{std::numeric_limits<uint32_t>::max()} ||
      w >= int64_t{std::numeric_limits<int32_t>::max()}) {
    return Status::Invalid(
        str_cat(kOp, ": B = ", b, " rows and W = ", w,
                " adapters exceed this implementation's limits (2^32 - 1 and 2^31 - 1)"));
  }
  // out is written: its rows must not overlap one another.
  if (b > 1 && out.strides[0] < h3) {
    return Status::Invalid(str_cat(kOp, ": out's row stride ", out.strides[0],
                                   " is smaller than its ", h3, " columns, so its rows overlap"));
  }
  AddLoraProblem p;
  p.desc = without_data<AddLoraOp>(t);
  if (!has_a) p.desc.weight_a = TensorView();
  p.b = b;
  p.h1 = h1;
  p.h2 = h2;
  p.h3 = h3;
  p.r = r;
  p.w = w;
  p.l = l;
  p.layer = options.layer_idx;
  p.y_offset = options.y_offset;
  p.has_a = has_a;
  p.out_like_y = same_layout(out, y);
  p.scale = scale;
  *problem = p;
  return Status::Ok();
}

Status AddLoraProblem::check(const AddLoraTensors &t) const {
  const std::pair<const TensorView *, const TensorView *> pairs[] = {{&desc.y, &t.y},
                                                                     {&desc.x, &t.x},
                                                                     {&desc.weight_b, &t.weight_b},
                                                                     {&desc.indices, &t.indices},
                                                                     {&desc.out, &t.out},
                                                                     {&desc.weight_a, &t.weight_a}};
  const char *names[] = {"y", "x", "weightB", "indices", "out", "weightAOptional"};
  for (size_t i = 0; i < 6; ++i) {
    const TensorView &planned = *pairs[i].first, &bound = *pairs[i].second;
    if (i == 5 && !has_a) {
      if (!bound.empty_view()) {
        return Status::Invalid(str_cat(
            kOp, ": weightAOptional is given but the plan was made without it; make a new plan"));
      }
      continue;
    }
    if (bound.empty_view()) return Status::NullPointer(str_cat(kOp, ": ", names[i], " is null"));
    FUSEKIT_RETURN_IF_ERROR(check_binding(kOp, names[i], planned, bound));
    if (bound.data == nullptr)
      return Status::NullPointer(str_cat(kOp, ": ", names[i], " has no data"));
  }
  // out: y itself (in place, when the problem's out has y's layout), or apart from every input.
  const bool in_place = out_like_y && t.out.data == t.y.data;
  if (!in_place && t.out.overlaps(t.y)) {
    return Status::Invalid(
        str_cat(kOp,
                ": out overlaps y without being the same tensor; pass y itself for an "
                "in-place update, or a separate buffer"));
  }
  for (const auto &[v, name] : {std::pair{&t.x, "x"},
                                {&t.weight_b, "weightB"},
                                {&t.weight_a, "weightAOptional"},
                                {&t.indices, "indices"}}) {
    if (v == &t.weight_a && !has_a) continue;
    if (t.out.overlaps(*v))
      return Status::Invalid(str_cat(kOp, ": out overlaps ", name, " in memory"));
  }
  return Status::Ok();
}

std::string AddLoraOp::problem_fields(const AddLoraProblem &p, const AddLoraTensors &t) {
  return str_cat("dtype=", dtype_name(p.desc.y.dtype), ",B=", p.b, ",H1=", p.h1, ",H2=", p.h2,
                 ",H3=", p.h3, ",R=", p.r, ",W=", p.w, ",weightA=", p.has_a ? "yes" : "no",
                 ",in_place=", t.out.data == t.y.data ? 1 : 0);
}
std::string AddLoraOp::result_fields(const AddLoraStats &st) {
  return str_cat("rows=", st.rows_with_adapter, ",prefill_groups=", st.prefill_groups,
                 ",decode_groups=", st.decode_groups);
}

std::vector<std::string> AddLora::implementations() {
  return implementation_names<AddLoraOp>();
}

Status AddLora::plan(const AddLoraProblem &problem, const AddLoraOptions &options, AddLora *plan) {
  if (plan == nullptr) return Status::NullPointer(str_cat(kOp, ": plan is null"));
  return make_plan<AddLoraOp>(problem, options, &plan->state_);
}

Status AddLora::plan(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                     const TensorView &indices, const TensorView &weight_a, const TensorView &out,
                     const AddLoraOptions &options, AddLora *plan) {
  if (plan == nullptr) return Status::NullPointer(str_cat(kOp, ": plan is null"));
  return make_bound_plan<AddLoraOp>({y, x, weight_b, indices, weight_a, out}, options,
                                    &plan->state_);
}

Status AddLora::run(const AddLoraTensors &tensors, void *workspace, size_t workspace_size,
                    AddLoraStats *stats, StreamHandle stream) const {
  return run_plan<AddLoraOp>(state_, tensors, {}, workspace, workspace_size, stats, stream);
}

Status AddLora::run(void *workspace, size_t workspace_size, AddLoraStats *stats) const {
  return run_bound<AddLoraOp>(state_, {}, workspace, workspace_size, stats, "run(workspace, ...)");
}

const char *AddLora::optimized_target() {
  return hwy_dispatched_target();
}

Status add_lora(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                const TensorView &indices, const TensorView &weight_a, const TensorView &out,
                const AddLoraOptions &options, AddLoraStats *stats) {
  return run_once<AddLoraOp>({y, x, weight_b, indices, weight_a, out}, options, {}, stats);
}

}  // namespace fusekit
