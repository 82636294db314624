// AddLora, the C++ API: phase one validates and plans; phase two checks the indices, groups the
// rows by adapter (a stable counting sort in the workspace), copies the untouched part of y into
// out when out is a separate tensor, and runs the kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "add_lora/add_lora_kernels.h"
#include "common/parallel.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/add_lora.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr size_t kAlign = 64;
constexpr const char *kOp = "AddLora";

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

struct WorkspaceLayout {
  size_t group_start = 0, cursor = 0, rows = 0, t = 0, a_panel = 0, b_panel = 0, per_thread = 0;
  AddLoraScratchSizes sizes{};
  size_t total = 0;
  bool overflow = false;
};

// The workspace: the counting sort's bookkeeping and order, the float32 shrunk rows t, and for the
// optimized kernel the packed weights of one group and each thread's scratch.
WorkspaceLayout layout_for(int64_t b, int64_t w, int64_t h1, int64_t h2, int64_t r, int threads,
                           bool panels) {
  WorkspaceLayout l;
  l.sizes = add_lora_scratch_sizes(h1, h2, r);
  const double estimate = static_cast<double>(b) * static_cast<double>(l.sizes.t_stride) * 4.0 +
                          static_cast<double>(l.sizes.a_panel_bytes) +
                          static_cast<double>(l.sizes.b_panel_bytes) +
                          static_cast<double>(l.sizes.per_thread_bytes) * threads;
  if (!(estimate < 1e18)) {
    l.overflow = true;
    return l;
  }
  size_t off = 0;
  l.group_start = off;
  off += align_up(static_cast<size_t>(w + 1) * sizeof(int64_t));
  l.cursor = off;
  off += align_up(static_cast<size_t>(w + 1) * sizeof(int64_t));
  l.rows = off;
  off += align_up(static_cast<size_t>(b) * sizeof(uint32_t));
  l.t = off;
  off += align_up(static_cast<size_t>(b) * static_cast<size_t>(l.sizes.t_stride) * sizeof(float));
  if (panels) {
    l.a_panel = off;
    off += align_up(l.sizes.a_panel_bytes);
    l.b_panel = off;
    off += align_up(l.sizes.b_panel_bytes);
    l.per_thread = off;
    off += align_up(l.sizes.per_thread_bytes) * static_cast<size_t>(threads);
  }
  l.total = off + kAlign;  // room to align the caller's pointer
  return l;
}

// Every tensor: present, the expected rank, positive sizes, a contiguous innermost dimension,
// non-negative strides, and an extent that fits 64-bit arithmetic.
Status check_tensor(const TensorView &t, const char *name, int ndim, const char *shape_name) {
  if (t.empty_view()) return Status::NullPointer(str_cat(kOp, ": ", name, " is null"));
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
  if (!t.inner_contiguous()) {
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
  if (t.data == nullptr) return Status::NullPointer(str_cat(kOp, ": ", name, " has no data"));
  return Status::Ok();
}

bool same_view(const TensorView &a, const TensorView &b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.strides[i] != b.strides[i])) return false;
  }
  return true;
}

bool float_dtype(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32;
}

}  // namespace

Status AddLora::plan(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                     const TensorView &indices, const TensorView &weight_a, const TensorView &out,
                     const AddLoraOptions &options, AddLora *plan) {
  if (plan == nullptr) return Status::NullPointer(str_cat(kOp, ": plan is null"));
  const bool has_a = !weight_a.empty_view();
  // Dtypes first (161002), then ranks and shapes (561002, as CANN reports them for AddLora).
  for (const auto &[t, name] : {std::pair{&y, "y"},
                                {&x, "x"},
                                {&weight_b, "weightB"},
                                {&indices, "indices"},
                                {&out, "out"}}) {
    if (t->empty_view()) return Status::NullPointer(str_cat(kOp, ": ", name, " is null"));
  }
  if (!float_dtype(y.dtype)) {
    return Status::Invalid(str_cat(kOp, ": y has dtype ", dtype_name(y.dtype),
                                   "; float16, bfloat16 and float32 are supported"));
  }
  for (const auto &[t, name] : {std::pair{&x, "x"},
                                {&weight_b, "weightB"},
                                {&weight_a, "weightAOptional"},
                                {&out, "out"}}) {
    if (t == &weight_a && !has_a) continue;
    if (t->dtype != y.dtype) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has dtype ", dtype_name(t->dtype),
                                     " but y has ", dtype_name(y.dtype), "; they must match"));
    }
  }
  if (indices.dtype != DType::kInt32) {
    return Status::Invalid(
        str_cat(kOp, ": indices has dtype ", dtype_name(indices.dtype), "; int32 is required"));
  }
  FUSEKIT_RETURN_IF_ERROR(check_tensor(y, "y", 2, "[B, H3]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(x, "x", 2, "[B, H1]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(weight_b, "weightB", 4, "[W, L, H2, R]"));
  FUSEKIT_RETURN_IF_ERROR(check_tensor(indices, "indices", 1, "[B]"));
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
  // out: its rows must not overlap one another; it may be y exactly, and must not touch any input.
  if (b > 1 && out.strides[0] < h3) {
    return Status::Invalid(str_cat(kOp, ": out's row stride ", out.strides[0],
                                   " is smaller than its ", h3, " columns, so its rows overlap"));
  }
  const bool in_place = same_view(out, y);
  if (!in_place && out.overlaps(y)) {
    return Status::Invalid(
        str_cat(kOp,
                ": out overlaps y without being the same tensor; pass y itself for an "
                "in-place update, or a separate buffer"));
  }
  for (const auto &[t, name] : {std::pair{&x, "x"},
                                {&weight_b, "weightB"},
                                {&weight_a, "weightAOptional"},
                                {&indices, "indices"}}) {
    if (t == &weight_a && !has_a) continue;
    if (out.overlaps(*t))
      return Status::Invalid(str_cat(kOp, ": out overlaps ", name, " in memory"));
  }

  AddLora p;
  p.y_ = y;
  p.x_ = x;
  p.wb_ = weight_b;
  p.idx_ = indices;
  p.wa_ = weight_a;
  p.out_ = out;
  p.b_ = b;
  p.h1_ = h1;
  p.h2_ = h2;
  p.h3_ = h3;
  p.r_ = r;
  p.w_ = w;
  p.layer_ = options.layer_idx;
  p.y_offset_ = options.y_offset;
  p.has_a_ = has_a;
  p.in_place_ = in_place;
  p.scale_ = scale;
  p.kernel_ = options.kernel;
  p.path_ = options.path;
  p.threads_ = std::max(1, options.num_threads > 0 ? options.num_threads : num_threads());
  const bool panels = p.kernel_ != KernelChoice::kReference;
  const WorkspaceLayout lay = layout_for(b, w, h1, h2, r, p.threads_, panels);
  if (lay.overflow) {
    return Status::Invalid(str_cat(kOp, ": the workspace for B = ", b, ", H1 = ", h1, ", H2 = ", h2,
                                   ", R = ", r, " overflows 64-bit sizes"));
  }
  p.workspace_bytes_ = lay.total;
  *plan = p;
  return Status::Ok();
}

Status AddLora::run(void *workspace, size_t workspace_size, AddLoraStats *stats) const {
  AddLoraStats local;
  AddLoraStats &st = stats != nullptr ? *stats : local;
  st = AddLoraStats();
  if (workspace_size < workspace_bytes_) {
    return Status::Invalid(
        str_cat(kOp, ": workspace of ", workspace_size, " bytes, ", workspace_bytes_, " needed"));
  }
  if (workspace == nullptr) return Status::NullPointer(str_cat(kOp, ": workspace is null"));
  StageTimer timer;
  const bool panels = kernel_ != KernelChoice::kReference;
  const WorkspaceLayout lay = layout_for(b_, w_, h1_, h2_, r_, threads_, panels);
  auto *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) /
                                        kAlign * kAlign);
  auto *group_start = reinterpret_cast<int64_t *>(base + lay.group_start);
  auto *cursor = reinterpret_cast<int64_t *>(base + lay.cursor);
  auto *rows = reinterpret_cast<uint32_t *>(base + lay.rows);

  // The data check and the counting sort's histogram, in one pass; nothing is written to out
  // until every index has been read.
  const auto *idx = idx_.as<const int32_t>();
  const int64_t istride = idx_.strides[0];
  std::fill(group_start, group_start + w_ + 1, int64_t{0});
  int64_t none = 0;
  for (int64_t i = 0; i < b_; ++i) {
    const int64_t a = idx[i * istride];
    if (a < 0 || a == w_) {
      ++none;
    } else if (a > w_) {
      return Status::ShapeMismatch(str_cat(kOp, ": indices[", i, "] = ", a, " but weightB has ", w_,
                                           " adapters (valid: 0..", w_ - 1, ", or -1 / ", w_,
                                           " for no adapter); nothing was written"));
    } else {
      ++group_start[a + 1];
    }
  }
  for (int64_t a = 0; a < w_; ++a) group_start[a + 1] += group_start[a];
  std::copy(group_start, group_start + w_, cursor);
  for (int64_t i = 0; i < b_; ++i) {  // stable: rows of one adapter stay in ascending order
    const int64_t a = idx[i * istride];
    if (a >= 0 && a < w_) rows[cursor[a]++] = static_cast<uint32_t>(i);
  }
  st.rows_with_adapter = b_ - none;
  st.rows_without_adapter = none;
  if (timer.on()) timer.stage("group");

  const size_t es = dtype_size(y_.dtype);
  // out is a separate tensor: the part of y that no update touches is copied, each element once.
  if (!in_place_) {
    const auto *ybytes = static_cast<const char *>(y_.data);
    auto *obytes = static_cast<char *>(out_.data);
    const int64_t ys = y_.strides[0], os = out_.strides[0];
    const int64_t w = w_, h2 = h2_, h3 = h3_, off = y_offset_;
    parallel_for(b_, threads_, std::max<int64_t>(1, 16384 / std::max<int64_t>(h3, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) {
                     const char *src = ybytes + static_cast<size_t>(i * ys) * es;
                     char *dst = obytes + static_cast<size_t>(i * os) * es;
                     const int64_t a = idx[i * istride];
                     if (a < 0 || a >= w) {
                       std::memcpy(dst, src, static_cast<size_t>(h3) * es);
                     } else {
                       std::memcpy(dst, src, static_cast<size_t>(off) * es);
                       const size_t tail = static_cast<size_t>(off + h2);
                       std::memcpy(dst + tail * es, src + tail * es,
                                   static_cast<size_t>(h3 - off - h2) * es);
                     }
                   }
                 });
  }
  if (timer.on() && !in_place_) timer.stage("copy");
  auto report = [&] {
    if (!timer.on()) return;
    timer.stage("compute");
    verbose_print(str_cat(
        kOp, ",dtype=", dtype_name(y_.dtype), ",B=", b_, ",H1=", h1_, ",H2=", h2_, ",H3=", h3_,
        ",R=", r_, ",W=", w_, ",weightA=", has_a_ ? "yes" : "no", ",in_place=", in_place_ ? 1 : 0,
        ",kernel=", kernel_ == KernelChoice::kReference ? "reference" : add_lora_optimized_target(),
        ",threads=", threads_, ",rows=", st.rows_with_adapter, ",prefill_groups=",
        st.prefill_groups, ",decode_groups=", st.decode_groups, ",", timer.fields()));
  };
  if (st.rows_with_adapter == 0) {
    report();
    return Status::Ok();
  }

  AddLoraArgs args;
  args.dtype = y_.dtype;
  args.x = x_.data;
  args.x_stride = x_.strides[0];
  args.y = y_.data;
  args.y_stride = y_.strides[0];
  args.out = out_.data;
  args.out_stride = out_.strides[0];
  if (has_a_) {
    args.wa =
        static_cast<const char *>(wa_.data) + static_cast<size_t>(layer_ * wa_.strides[1]) * es;
    args.wa_adapter_stride = wa_.strides[0];
    args.wa_row_stride = wa_.strides[2];
  } else {
    args.wa = nullptr;
    args.wa_adapter_stride = args.wa_row_stride = 0;
  }
  args.wb = static_cast<const char *>(wb_.data) + static_cast<size_t>(layer_ * wb_.strides[1]) * es;
  args.wb_adapter_stride = wb_.strides[0];
  args.wb_row_stride = wb_.strides[2];
  args.h1 = h1_;
  args.h2 = h2_;
  args.r = r_;
  args.y_offset = y_offset_;
  args.scale = scale_;
  args.rows = rows;
  args.group_start = group_start;
  args.adapters = w_;

  AddLoraScratch scratch{};
  scratch.t = reinterpret_cast<float *>(base + lay.t);
  scratch.t_stride = lay.sizes.t_stride;
  if (!panels) {
    add_lora_reference(args, scratch);
    report();
    return Status::Ok();
  }
  scratch.a_panel = reinterpret_cast<float *>(base + lay.a_panel);
  scratch.b_panel = reinterpret_cast<float *>(base + lay.b_panel);
  scratch.per_thread = base + lay.per_thread;
  scratch.per_thread_bytes = align_up(lay.sizes.per_thread_bytes);
  scratch.group_list = cursor;  // the sort is done with it
  const int64_t min_rows = path_ == AddLoraPath::kPrefill  ? int64_t{1}
                           : path_ == AddLoraPath::kDecode ? std::numeric_limits<int64_t>::max()
                                                           : kPrefillMinRows;
  const AddLoraRunInfo info = add_lora_optimized()(args, scratch, threads_, min_rows);
  st.prefill_groups = info.prefill_groups;
  st.decode_groups = info.decode_groups;
  report();
  return Status::Ok();
}

const char *AddLora::optimized_target() {
  return add_lora_optimized_target();
}

Status add_lora(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                const TensorView &indices, const TensorView &weight_a, const TensorView &out,
                const AddLoraOptions &options, AddLoraStats *stats) {
  AddLora plan;
  FUSEKIT_RETURN_IF_ERROR(AddLora::plan(y, x, weight_b, indices, weight_a, out, options, &plan));
  std::unique_ptr<char[]> workspace(new (std::nothrow) char[plan.workspace_size()]);
  if (!workspace) {
    return Status::Runtime(
        str_cat(kOp, ": could not allocate a workspace of ", plan.workspace_size(), " bytes"));
  }
  return plan.run(workspace.get(), plan.workspace_size(), stats);
}

}  // namespace fusekit
