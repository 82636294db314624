// ApplyAdamWQuant and AdamW, the C++ API: phase one validates and plans; phase two checks the data
// (step, the two maps) before writing anything, builds the nearest-code tables in the workspace and
// runs the kernel over threads, each thread owning whole blocks of 256 elements (so the result does
// not depend on the thread count).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/parallel.h"
#include "common/str_cat.h"
#include "fusekit/apply_adam_w_quant.h"
#include "fusekit/threading.h"

namespace fusekit {
namespace {

constexpr size_t kAlign = 64;
constexpr const char *kOp = "ApplyAdamWQuant";
constexpr const char *kOpAdamW = "AdamW";
constexpr int64_t kBlock = kAdamWQuantBlockSize;
constexpr int64_t kMaxStep = int64_t{1} << 62;
// Tensors from this many elements on use the 65,536-entry table (building it costs ~0.1 ms).
constexpr int64_t kTableMinElements = 65536;

bool is_float_type(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// n = product of the shape, refusing negative sizes and 64-bit overflow; also checks that the
// farthest element's offset fits.
Status checked_numel(const char *op, const TensorView &t, const char *name, int64_t *n) {
  int64_t count = 1, reach = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      return Status::Invalid(
          str_cat(op, ": ", name, " has a negative size in shape ", t.shape_string()));
    int64_t span = 0;
    if (__builtin_mul_overflow(count, t.shape[i], &count) ||
        (t.shape[i] > 0 &&
         __builtin_mul_overflow(t.shape[i] - 1, t.strides[i] < 0 ? -t.strides[i] : t.strides[i],
                                &span)) ||
        __builtin_add_overflow(reach, span, &reach)) {
      return Status::Invalid(
          str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
    }
  }
  if (__builtin_mul_overflow(reach, static_cast<int64_t>(std::max<size_t>(dtype_size(t.dtype), 1)),
                             &reach)) {
    return Status::Invalid(
        str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  *n = count;
  return Status::Ok();
}

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

std::string strides_string(const TensorView &t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
  return s + "]";
}

Status check_attr(const char *op, const char *name, double value, bool ok, const char *rule) {
  if (!std::isfinite(value) || !std::isfinite(static_cast<float>(value)) || !ok) {
    return Status::Invalid(str_cat(op, ": ", name, " = ", value, " ", rule));
  }
  return Status::Ok();
}

Status check_attributes(const char *op, double lr, double beta1, double beta2, double weight_decay,
                        double eps, double gnorm_scale) {
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "lr", lr, lr >= 0.0, "must be finite and >= 0"));
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "beta1", beta1,
                                     beta1 >= 0.0 && static_cast<float>(beta1) < 1.0f,
                                     "must be in [0, 1) in float32"));
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "beta2", beta2,
                                     beta2 >= 0.0 && static_cast<float>(beta2) < 1.0f,
                                     "must be in [0, 1) in float32"));
  FUSEKIT_RETURN_IF_ERROR(
      check_attr(op, "weightDecay", weight_decay, true, "must be finite in float32"));
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "eps", eps, static_cast<float>(eps) > 0.0f,
                                     "must be finite and > 0 in float32"));
  FUSEKIT_RETURN_IF_ERROR(
      check_attr(op, "gnormScale", gnorm_scale, true, "must be finite in float32"));
  return Status::Ok();
}

Status check_step(const char *op, int64_t step) {
  if (step < 0 || step >= kMaxStep) {
    return Status::Invalid(
        str_cat(op, ": step = ", step, " must be in [0, 2^62); nothing was modified"));
  }
  return Status::Ok();
}

// The float32 scalars, computed as CANN's kernel computes them.
AdamScalars derive(int64_t step, float lr, float beta1, float beta2, float weight_decay, float eps,
                   float gnorm_scale) {
  const float t = static_cast<float>(step + 1);
  const float c1 = 1.0f - ::powf(beta1, t);
  const float c2s = ::sqrtf(1.0f - ::powf(beta2, t));
  AdamScalars s;
  s.beta1 = beta1;
  s.beta2 = beta2;
  s.one_minus_beta1 = 1.0f - beta1;
  s.one_minus_beta2 = 1.0f - beta2;
  s.gnorm_scale = gnorm_scale;
  s.step_size = (-lr * c2s) / c1;
  s.eps_c2s = eps * c2s;
  s.decay = 1.0f - lr * weight_decay;
  s.apply_decay = weight_decay > 0.0f;
  return s;
}

Status check_map_view(const TensorView &q, const char *name) {
  if (q.dtype != DType::kFloat32 || q.ndim != 1 || q.shape[0] != kQuantMapSize) {
    return Status::Invalid(str_cat(kOp, ": ", name, " must be float32 [256], got ",
                                   dtype_name(q.dtype), " ", q.shape_string()));
  }
  if (q.data == nullptr) return Status::NullPointer(str_cat(kOp, ": ", name, " has no data"));
  return Status::Ok();
}

// Phase two's check of a map: 256 finite floats, ascending.
Status check_map_data(const TensorView &q, const char *name) {
  const float *p = q.as<const float>();
  const int64_t s = q.strides[0];
  for (int i = 0; i < kQuantMapSize; ++i) {
    const float x = p[i * s];
    if (!std::isfinite(x)) {
      return Status::Invalid(
          str_cat(kOp, ": ", name, "[", i, "] = ", x, " is not finite; nothing was modified"));
    }
    if (i > 0 && x < p[(i - 1) * s]) {
      return Status::Invalid(str_cat(kOp, ": ", name, "[", i, "] = ", x, " is less than ", name,
                                     "[", i - 1, "] = ", p[(i - 1) * s],
                                     "; the map must be ascending; nothing was modified"));
    }
  }
  return Status::Ok();
}

// Element offsets of the flat (row-major) indices [start, start + count) of a view.
void element_offsets(const TensorView &t, int64_t start, int64_t count, int64_t *out) {
  int64_t idx[TensorView::kMaxDims] = {};
  int64_t rest = start, off = 0;
  for (int i = t.ndim - 1; i >= 0; --i) {
    idx[i] = t.shape[i] > 0 ? rest % t.shape[i] : 0;
    rest = t.shape[i] > 0 ? rest / t.shape[i] : 0;
    off += idx[i] * t.strides[i];
  }
  for (int64_t k = 0; k < count; ++k) {
    out[k] = off;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (++idx[i] < t.shape[i]) {
        off += t.strides[i];
        break;
      }
      off -= (t.shape[i] - 1) * t.strides[i];
      idx[i] = 0;
    }
  }
}

// Copies runs of consecutive offsets (a row of an inner-contiguous view) with one memcpy each.
template <typename Copy>
void for_each_run(const int64_t *offs, int64_t count, Copy &&copy) {
  int64_t k = 0;
  while (k < count) {
    int64_t j = k + 1;
    while (j < count && offs[j] == offs[j - 1] + 1) ++j;
    copy(k, offs[k], j - k);
    k = j;
  }
}

void gather(const TensorView &t, const int64_t *offs, int64_t count, void *dst) {
  const auto es = static_cast<int64_t>(dtype_size(t.dtype));
  const auto *src = static_cast<const char *>(t.data);
  auto *d = static_cast<char *>(dst);
  for_each_run(offs, count, [&](int64_t k, int64_t off, int64_t len) {
    std::memcpy(d + k * es, src + off * es, static_cast<size_t>(len * es));
  });
}

void scatter(const TensorView &t, const int64_t *offs, int64_t count, const void *src_buf) {
  const auto es = static_cast<int64_t>(dtype_size(t.dtype));
  auto *dst = static_cast<char *>(t.data);
  const auto *s = static_cast<const char *>(src_buf);
  for_each_run(offs, count, [&](int64_t k, int64_t off, int64_t len) {
    std::memcpy(dst + off * es, s + k * es, static_cast<size_t>(len * es));
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ApplyAdamWQuant
// ---------------------------------------------------------------------------------------------
Status ApplyAdamWQuant::plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                             const TensorView &v, const TensorView &qmap_m,
                             const TensorView &qmap_v, const TensorView &absmax_m,
                             const TensorView &absmax_v, const ApplyAdamWQuantOptions &options,
                             ApplyAdamWQuant *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  if (!is_float_type(var.dtype)) {
    return Status::Invalid(str_cat(kOp, ": varRef has dtype ", dtype_name(var.dtype),
                                   "; float32, float16 or bfloat16 is required"));
  }
  if (grad.dtype != var.dtype) {
    return Status::Invalid(str_cat(kOp, ": grad has dtype ", dtype_name(grad.dtype),
                                   " but varRef has ", dtype_name(var.dtype), "; they must match"));
  }
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
  for (const auto &[t, name] : same) {
    bool equal = t->ndim == var.ndim;
    for (int i = 0; equal && i < var.ndim; ++i) equal = t->shape[i] == var.shape[i];
    if (!equal) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has shape ", t->shape_string(),
                                     " but varRef has ", var.shape_string(), "; they must match"));
    }
  }
  int64_t n = 0, unused = 0;
  FUSEKIT_RETURN_IF_ERROR(checked_numel(kOp, var, "varRef", &n));
  FUSEKIT_RETURN_IF_ERROR(checked_numel(kOp, grad, "grad", &unused));
  FUSEKIT_RETURN_IF_ERROR(checked_numel(kOp, m, "mRef", &unused));
  FUSEKIT_RETURN_IF_ERROR(checked_numel(kOp, v, "vRef", &unused));
  if (options.block_size != kBlock) {
    return Status::Invalid(
        str_cat(kOp, ": blockSize = ", options.block_size, "; only 256 is supported"));
  }
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::pair<const TensorView *, const char *> scales[] = {{&absmax_m, "absmaxMRef"},
                                                                {&absmax_v, "absmaxVRef"}};
  for (const auto &[t, name] : scales) {
    if (t->dtype != DType::kFloat32 || t->ndim != 1 || t->shape[0] != blocks) {
      return Status::Invalid(str_cat(kOp, ": ", name, " must be float32 [", blocks, "] (ceil(", n,
                                     " / 256)), got ", dtype_name(t->dtype), " ",
                                     t->shape_string()));
    }
    FUSEKIT_RETURN_IF_ERROR(checked_numel(kOp, *t, name, &unused));
  }
  FUSEKIT_RETURN_IF_ERROR(check_map_view(qmap_m, "qmapM"));
  FUSEKIT_RETURN_IF_ERROR(check_map_view(qmap_v, "qmapV"));
  if (n > 0) {
    const std::pair<const TensorView *, const char *> all[] = {
        {&var, "varRef"}, {&grad, "grad"},           {&m, "mRef"},
        {&v, "vRef"},     {&absmax_m, "absmaxMRef"}, {&absmax_v, "absmaxVRef"}};
    for (const auto &[t, name] : all) {
      if (t->data == nullptr) return Status::NullPointer(str_cat(kOp, ": ", name, " has no data"));
    }
  }
  FUSEKIT_RETURN_IF_ERROR(check_attributes(kOp, options.lr, options.beta1, options.beta2,
                                           options.weight_decay, options.eps, options.gnorm_scale));
  // In-place outputs: no element reachable twice, no memory shared with any other argument.
  const std::pair<const TensorView *, const char *> outs[] = {{&var, "varRef"},
                                                              {&m, "mRef"},
                                                              {&v, "vRef"},
                                                              {&absmax_m, "absmaxMRef"},
                                                              {&absmax_v, "absmaxVRef"}};
  const std::pair<const TensorView *, const char *> args[] = {
      {&var, "varRef"},          {&m, "mRef"},    {&v, "vRef"},       {&absmax_m, "absmaxMRef"},
      {&absmax_v, "absmaxVRef"}, {&grad, "grad"}, {&qmap_m, "qmapM"}, {&qmap_v, "qmapV"}};
  for (size_t i = 0; i < 5; ++i) {
    if (self_overlapping(*outs[i].first)) {
      return Status::Invalid(str_cat(kOp, ": ", outs[i].second, " of shape ",
                                     outs[i].first->shape_string(), " and strides ",
                                     strides_string(*outs[i].first),
                                     " reaches some elements twice; an in-place tensor must not"));
    }
    for (size_t j = i + 1; j < 8; ++j) {
      if (outs[i].first->overlaps(*args[j].first)) {
        return Status::Invalid(
            str_cat(kOp, ": ", outs[i].second, " and ", args[j].second, " overlap in memory"));
      }
    }
  }

  ApplyAdamWQuant p;
  p.var_ = var;
  p.grad_ = grad;
  p.m_ = m;
  p.v_ = v;
  p.qmap_m_ = qmap_m;
  p.qmap_v_ = qmap_v;
  p.absmax_m_ = absmax_m;
  p.absmax_v_ = absmax_v;
  p.n_ = n;
  p.blocks_ = blocks;
  p.contiguous_ =
      var.is_contiguous() && grad.is_contiguous() && m.is_contiguous() && v.is_contiguous();
  p.lr_ = static_cast<float>(options.lr);
  p.beta1_ = static_cast<float>(options.beta1);
  p.beta2_ = static_cast<float>(options.beta2);
  p.weight_decay_ = static_cast<float>(options.weight_decay);
  p.eps_ = static_cast<float>(options.eps);
  p.gnorm_scale_ = static_cast<float>(options.gnorm_scale);
  p.kernel_ = options.kernel;
  p.use_table_ = p.kernel_ != KernelChoice::kReference &&
                 (options.search == QuantSearch::kTable ||
                  (options.search == QuantSearch::kAuto && n >= kTableMinElements));
  p.threads_ = options.num_threads > 0 ? options.num_threads : num_threads();
  p.workspace_bytes_ = 2 * quant_tables_bytes(p.use_table_) + kAlign;
  *out = p;
  return Status::Ok();
}

Status ApplyAdamWQuant::run(int64_t step, void *workspace, size_t workspace_size,
                            ApplyAdamWQuantStats *stats) const {
  ApplyAdamWQuantStats local;
  ApplyAdamWQuantStats &st = stats != nullptr ? *stats : local;
  st = ApplyAdamWQuantStats();
  if (workspace_size < workspace_bytes_) {
    return Status::Invalid(
        str_cat(kOp, ": workspace of ", workspace_size, " bytes, ", workspace_bytes_, " needed"));
  }
  if (workspace == nullptr) return Status::NullPointer(str_cat(kOp, ": workspace is null"));
  FUSEKIT_RETURN_IF_ERROR(check_step(kOp, step));
  FUSEKIT_RETURN_IF_ERROR(check_map_data(qmap_m_, "qmapM"));
  FUSEKIT_RETURN_IF_ERROR(check_map_data(qmap_v_, "qmapV"));
  if (n_ == 0) return Status::Ok();

  auto *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) /
                                        kAlign * kAlign);
  AdamWQuantArgs a;
  // The lookup tables (256 KiB each) only where the dispatched kernel reads them; the workspace
  // layout stays as sized in phase one.
  const bool tables = use_table_ && adam_w_quant_optimized_uses_tables();
  build_quant_tables(qmap_m_.as<const float>(), qmap_m_.strides[0], true, tables, base, &a.map_m);
  build_quant_tables(qmap_v_.as<const float>(), qmap_v_.strides[0], false, tables,
                     base + quant_tables_bytes(use_table_), &a.map_v);
  static_cast<AdamScalars &>(a) =
      derive(step, lr_, beta1_, beta2_, weight_decay_, eps_, gnorm_scale_);
  a.var = var_.data;
  a.grad = grad_.data;
  a.m = m_.as<uint8_t>();
  a.v = v_.as<uint8_t>();
  a.absmax_m = absmax_m_.as<float>();
  a.absmax_m_stride = absmax_m_.strides[0];
  a.absmax_v = absmax_v_.as<float>();
  a.absmax_v_stride = absmax_v_.strides[0];
  a.n = n_;
  a.dtype = var_.dtype;
  const AdamWQuantBlocksFn kernel = kernel_ == KernelChoice::kReference
                                        ? &adam_w_quant_blocks_reference
                                        : adam_w_quant_blocks_optimized();

  std::atomic<int64_t> skipped{0};
  if (contiguous_) {
    // Runs of blocks taken from a shared counter, so that a thread slowed down (a shared machine)
    // leaves its work to the others; blocks are independent, so results do not depend on which
    // thread takes a run. Runs of up to 1024 blocks (256K elements) keep the kernel's per-call
    // setup (its register tables) negligible.
    const int64_t run =
        std::clamp<int64_t>(blocks_ / (int64_t{8} * std::max(threads_, 1)), 16, 1024);
    std::atomic<int64_t> next{0};
    parallel_for(std::min<int64_t>(threads_, (blocks_ + run - 1) / run), threads_, 1,
                 [&](int64_t, int64_t) {
                   int64_t run_skipped = 0;
                   for (int64_t b = next.fetch_add(run, std::memory_order_relaxed); b < blocks_;
                        b = next.fetch_add(run, std::memory_order_relaxed)) {
                     run_skipped += kernel(a, b, std::min(blocks_, b + run));
                   }
                   skipped.fetch_add(run_skipped, std::memory_order_relaxed);
                 });
  } else {
    // Any other layout: each block is gathered into contiguous buffers, updated, scattered back.
    parallel_for(blocks_, threads_, 16, [&](int64_t b, int64_t e) {
      alignas(64) char var_buf[kBlock * 4], grad_buf[kBlock * 4];
      alignas(64) uint8_t m_buf[kBlock], v_buf[kBlock];
      int64_t offs[4][kBlock];
      const TensorView *views[4] = {&var_, &grad_, &m_, &v_};
      int64_t local_skipped = 0;
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t lo = blk * kBlock, len = std::min(kBlock, n_ - lo);
        for (int k = 0; k < 4; ++k) element_offsets(*views[k], lo, len, offs[k]);
        gather(var_, offs[0], len, var_buf);
        gather(grad_, offs[1], len, grad_buf);
        gather(m_, offs[2], len, m_buf);
        gather(v_, offs[3], len, v_buf);
        AdamWQuantArgs one = a;
        one.var = var_buf;
        one.grad = grad_buf;
        one.m = m_buf;
        one.v = v_buf;
        one.absmax_m = a.absmax_m + blk * a.absmax_m_stride;
        one.absmax_v = a.absmax_v + blk * a.absmax_v_stride;
        one.n = len;
        if (kernel(one, 0, 1) != 0) {
          ++local_skipped;
          continue;
        }
        scatter(var_, offs[0], len, var_buf);
        scatter(m_, offs[2], len, m_buf);
        scatter(v_, offs[3], len, v_buf);
      }
      skipped.fetch_add(local_skipped, std::memory_order_relaxed);
    });
  }
  st.blocks_skipped_nonfinite = skipped.load();
  st.blocks_updated = blocks_ - st.blocks_skipped_nonfinite;
  return Status::Ok();
}

Status apply_adam_w_quant_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                               const TensorView &v, const TensorView &qmap_m,
                               const TensorView &qmap_v, const TensorView &absmax_m,
                               const TensorView &absmax_v, int64_t step,
                               const ApplyAdamWQuantOptions &options, ApplyAdamWQuantStats *stats) {
  ApplyAdamWQuant plan;
  FUSEKIT_RETURN_IF_ERROR(
      ApplyAdamWQuant::plan(var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v, options, &plan));
  std::unique_ptr<char[]> workspace(new (std::nothrow) char[plan.workspace_size()]);
  if (!workspace) {
    return Status::Runtime(
        str_cat(kOp, ": could not allocate a workspace of ", plan.workspace_size(), " bytes"));
  }
  return plan.run(step, workspace.get(), plan.workspace_size(), stats);
}

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------
Status AdamW::plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, const AdamWOptions &options, AdamW *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOpAdamW, ": out is null"));
  if (!is_float_type(var.dtype)) {
    return Status::Invalid(str_cat(kOpAdamW, ": var has dtype ", dtype_name(var.dtype),
                                   "; float32, float16 or bfloat16 is required"));
  }
  if (grad.dtype != var.dtype) {
    return Status::Invalid(str_cat(kOpAdamW, ": grad has dtype ", dtype_name(grad.dtype),
                                   " but var has ", dtype_name(var.dtype), "; they must match"));
  }
  if (m.dtype != DType::kFloat32 || v.dtype != DType::kFloat32) {
    return Status::Invalid(str_cat(kOpAdamW, ": m and v must be float32, got ", dtype_name(m.dtype),
                                   " and ", dtype_name(v.dtype)));
  }
  int64_t n = 0, other = 0;
  FUSEKIT_RETURN_IF_ERROR(checked_numel(kOpAdamW, var, "var", &n));
  const std::pair<const TensorView *, const char *> all[] = {
      {&var, "var"}, {&grad, "grad"}, {&m, "m"}, {&v, "v"}};
  for (const auto &[t, name] : all) {
    FUSEKIT_RETURN_IF_ERROR(checked_numel(kOpAdamW, *t, name, &other));
    if (other != n) {
      return Status::Invalid(str_cat(kOpAdamW, ": ", name, " has ", other, " elements ",
                                     t->shape_string(), " but var has ", n, "; they must match"));
    }
    if (!t->is_contiguous()) {
      return Status::Invalid(str_cat(kOpAdamW, ": ", name, " must be contiguous, got shape ",
                                     t->shape_string(), " with strides ", strides_string(*t)));
    }
    if (n > 0 && t->data == nullptr)
      return Status::NullPointer(str_cat(kOpAdamW, ": ", name, " has no data"));
  }
  FUSEKIT_RETURN_IF_ERROR(check_attributes(kOpAdamW, options.lr, options.beta1, options.beta2,
                                           options.weight_decay, options.eps, options.gnorm_scale));
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = i + 1; j < 4; ++j) {
      if (all[i].first->overlaps(*all[j].first)) {  // every pair holds a tensor written in place
        return Status::Invalid(
            str_cat(kOpAdamW, ": ", all[i].second, " and ", all[j].second, " overlap in memory"));
      }
    }
  }
  AdamW p;
  p.var_ = var;
  p.grad_ = grad;
  p.m_ = m;
  p.v_ = v;
  p.n_ = n;
  p.lr_ = static_cast<float>(options.lr);
  p.beta1_ = static_cast<float>(options.beta1);
  p.beta2_ = static_cast<float>(options.beta2);
  p.weight_decay_ = static_cast<float>(options.weight_decay);
  p.eps_ = static_cast<float>(options.eps);
  p.gnorm_scale_ = static_cast<float>(options.gnorm_scale);
  p.kernel_ = options.kernel;
  p.threads_ = options.num_threads > 0 ? options.num_threads : num_threads();
  *out = p;
  return Status::Ok();
}

Status AdamW::run(int64_t step, AdamWStats *stats) const {
  AdamWStats local;
  AdamWStats &st = stats != nullptr ? *stats : local;
  st = AdamWStats();
  FUSEKIT_RETURN_IF_ERROR(check_step(kOpAdamW, step));
  if (n_ == 0) return Status::Ok();
  AdamWArgs a;
  static_cast<AdamScalars &>(a) =
      derive(step, lr_, beta1_, beta2_, weight_decay_, eps_, gnorm_scale_);
  a.var = var_.data;
  a.grad = grad_.data;
  a.m = m_.as<float>();
  a.v = v_.as<float>();
  a.dtype = var_.dtype;
  const AdamWElementsFn kernel = kernel_ == KernelChoice::kReference ? &adam_w_elements_reference
                                                                     : adam_w_elements_optimized();
  std::atomic<int64_t> skipped{0};
  parallel_for(n_, threads_, 16384, [&](int64_t b, int64_t e) {
    skipped.fetch_add(kernel(a, b, e), std::memory_order_relaxed);
  });
  st.elements_skipped_nonfinite = skipped.load();
  return Status::Ok();
}

Status adam_w_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                   const TensorView &v, int64_t step, const AdamWOptions &options,
                   AdamWStats *stats) {
  AdamW plan;
  FUSEKIT_RETURN_IF_ERROR(AdamW::plan(var, grad, m, v, options, &plan));
  return plan.run(step, stats);
}

}  // namespace fusekit
