// LazyAdam, the C++ API: phase one validates and plans; phase two checks the data and runs.
//
// Phase two, in stages:
//   check   one pass over the indices: range check (nothing is written before it passes), the
//           entries (row << 32 | position), and a bitmap over the table's rows that tells whether
//           any row is named twice;
//   group   only when some row is named twice: a stable radix sort of the entries by row, so that
//           the occurrences of a row become neighbours in order of occurrence (summed, applied
//           once);
//   update  the kernel over threads, each thread owning whole rows.
// Without duplicates (what Rec SDK's Python layer hands the operator) the table is walked in the
// order of the indices: measured here, that beats the sorted walk by 1.6x, since the gradient is
// then read sequentially and the three table rows are prefetched ahead.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/parallel.h"
#include "common/radix_sort.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/threading.h"
#include "lazy_adam/lazy_adam_kernels.h"

namespace fusekit {
namespace {

constexpr size_t kAlign = 64;
constexpr const char *kOp = "LazyAdam";

// Rows in flight: enough entries ahead to cover memory latency, few enough that the prefetched
// lines (four rows per entry) stay within what the core can track. FBGEMM's sparse optimizers
// prefetch 16 rows ahead.
int64_t prefetch_ahead(int64_t dim) {
  static const int64_t forced = [] {
    const char *e = std::getenv("FUSEKIT_LAZY_ADAM_PREFETCH");  // for tuning runs only
    return e != nullptr ? std::atoll(e) : 0;
  }();
  if (forced > 0) return forced;
  const int64_t row_bytes = std::max<int64_t>(dim, 1) * 4;
  return std::clamp<int64_t>(2048 / row_bytes, 2, 16);
}

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The workspace: entries and their sort buffer, the sort's histograms, one gradient row of
// scratch per thread.
struct WorkspaceLayout {
  size_t entries = 0, entries_tmp = 0, hist = 0, scratch = 0, scratch_per_thread = 0, lead = 0;
  size_t bitmap = 0, bitmap_bytes = 0, total = 0;
};

// The duplicate bitmap costs rows / 8 bytes; past this it is not worth it and every batch is
// grouped by sorting instead.
std::atomic<int64_t> g_max_bitmap_bytes{int64_t{64} << 20};

WorkspaceLayout layout_for(int64_t n, int64_t d, int64_t rows, int threads) {
  WorkspaceLayout w;
  size_t off = 0;
  const int64_t bitmap_bytes = (rows + 63) / 64 * 8;
  const int64_t limit = g_max_bitmap_bytes.load(std::memory_order_relaxed);
  if (limit >= 0 && bitmap_bytes <= std::max<int64_t>(limit, 8 * n)) {
    w.bitmap = off;
    w.bitmap_bytes = static_cast<size_t>(bitmap_bytes);
    off += align_up(w.bitmap_bytes);
  }
  w.entries = off;
  off += align_up(static_cast<size_t>(n) * sizeof(uint64_t));
  w.entries_tmp = off;
  off += align_up(static_cast<size_t>(n) * sizeof(uint64_t));
  w.hist = off;
  off += align_up(radix_sort_scratch_bytes(threads));
  w.lead = off;
  off += align_up(static_cast<size_t>(n) * sizeof(uint32_t));
  w.scratch = off;
  w.scratch_per_thread = align_up(static_cast<size_t>(std::max<int64_t>(d, 1)) * sizeof(float));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kAlign;  // room to align the caller's pointer
  return w;
}

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
  if (t.data == nullptr && t.numel() > 0) {
    return Status::NullPointer(str_cat(kOp, ": ", name, " has no data"));
  }
  return Status::Ok();
}

}  // namespace

void set_lazy_adam_bitmap_limit_for_testing(int64_t bytes) {
  g_max_bitmap_bytes.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
}

Status LazyAdam::plan(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, const LazyAdamOptions &options,
                      LazyAdam *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(kOp, ": out is null"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(gradient, "gradient"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(m, "inputM"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(v, "inputV"));
  FUSEKIT_RETURN_IF_ERROR(check_float_table(var, "inputVar"));
  // The tables are written: two of their rows must not share elements.
  for (const auto &[t, name] :
       {std::pair{&m, "inputM"}, std::pair{&v, "inputV"}, std::pair{&var, "inputVar"}}) {
    if (t->shape[0] > 1 && t->shape[1] > 0 && t->strides[0] < t->shape[1]) {
      return Status::Invalid(str_cat(kOp, ": ", name, " has row stride ", t->strides[0], " < ",
                                     t->shape[1], " columns: its rows overlap"));
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
  if (indices.data == nullptr && n > 0)
    return Status::NullPointer(str_cat(kOp, ": indices has no data"));
  const int64_t rows = m.shape[0];
  if (n > int64_t{std::numeric_limits<uint32_t>::max()} ||
      rows >= int64_t{std::numeric_limits<uint32_t>::max()}) {
    return Status::Invalid(
        str_cat(kOp, ": ", n, " indices into ", rows,
                " rows exceeds this implementation's limit of 2^32 - 1 of each"));
  }
  if (!(options.beta1 >= 0.0 && options.beta1 < 1.0)) {
    return Status::Invalid(str_cat(kOp, ": beta1 = ", options.beta1, " must be in [0, 1)"));
  }
  if (!(options.beta2 >= 0.0 && options.beta2 < 1.0)) {
    return Status::Invalid(str_cat(kOp, ": beta2 = ", options.beta2, " must be in [0, 1)"));
  }
  if (!(std::isfinite(options.epsilon) && options.epsilon > 0.0 &&
        static_cast<float>(options.epsilon) > 0.0f &&
        std::isfinite(static_cast<float>(options.epsilon)))) {
    return Status::Invalid(
        str_cat(kOp, ": epsilon = ", options.epsilon, " must be finite and > 0 in float32"));
  }
  // The tables are updated in place: they must not share memory with each other or the inputs.
  const std::pair<const TensorView *, const char *> tables[] = {
      {&m, "inputM"}, {&v, "inputV"}, {&var, "inputVar"}};
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = i + 1; j < 3; ++j) {
      if (tables[i].first->overlaps(*tables[j].first)) {
        return Status::Invalid(
            str_cat(kOp, ": ", tables[i].second, " and ", tables[j].second, " overlap in memory"));
      }
    }
    if (tables[i].first->overlaps(gradient)) {
      return Status::Invalid(
          str_cat(kOp, ": gradient and ", tables[i].second, " overlap in memory"));
    }
    if (tables[i].first->overlaps(indices)) {
      return Status::Invalid(
          str_cat(kOp, ": indices and ", tables[i].second, " overlap in memory"));
    }
  }

  LazyAdam p;
  p.gradient_ = gradient;
  p.indices_ = indices;
  p.m_ = m;
  p.v_ = v;
  p.var_ = var;
  p.n_ = n;
  p.d_ = m.shape[1];
  p.r_ = rows;
  p.index_stride_ = indices.strides[0];
  p.beta1_ = static_cast<float>(options.beta1);
  p.beta2_ = static_cast<float>(options.beta2);
  p.epsilon_ = static_cast<float>(options.epsilon);
  p.kernel_ = options.kernel;
  p.threads_ = options.num_threads > 0 ? options.num_threads : num_threads();
  p.workspace_bytes_ = n == 0 ? 0 : layout_for(n, p.d_, rows, p.threads_).total;
  *out = p;
  return Status::Ok();
}

Status LazyAdam::run(float lr, void *workspace, size_t workspace_size, LazyAdamStats *stats) const {
  LazyAdamStats local;
  LazyAdamStats &st = stats != nullptr ? *stats : local;
  st = LazyAdamStats();
  if (!std::isfinite(lr)) return Status::Invalid(str_cat(kOp, ": lr = ", lr, " is not finite"));
  if (n_ == 0) return Status::Ok();
  if (workspace_size < workspace_bytes_) {
    return Status::Invalid(
        str_cat(kOp, ": workspace of ", workspace_size, " bytes, ", workspace_bytes_, " needed"));
  }
  if (workspace == nullptr) return Status::NullPointer(str_cat(kOp, ": workspace is null"));
  StageTimer timer;
  const WorkspaceLayout w = layout_for(n_, d_, r_, threads_);
  auto *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) /
                                        kAlign * kAlign);
  auto *entries = reinterpret_cast<uint64_t *>(base + w.entries);
  auto *entries_tmp = reinterpret_cast<uint64_t *>(base + w.entries_tmp);
  auto *hist = reinterpret_cast<uint64_t *>(base + w.hist);
  uint64_t *bitmap = w.bitmap_bytes > 0 ? reinterpret_cast<uint64_t *>(base + w.bitmap) : nullptr;
  if (bitmap != nullptr) std::memset(bitmap, 0, w.bitmap_bytes);

  // Check every index and build (row << 32 | position); padding gets row R.
  const int64_t n = n_, rows = r_, stride = index_stride_;
  const bool wide = indices_.dtype == DType::kInt64;
  const void *idx = indices_.data;
  int64_t first_bad = n, padding = 0;
  int duplicates = bitmap == nullptr ? 1 : 0;
  auto index_at = [&](int64_t i) -> int64_t {
    return wide ? static_cast<const int64_t *>(idx)[i * stride]
                : static_cast<const int32_t *>(idx)[i * stride];
  };
  // Writes entry i and returns its row (R for padding and for an index out of range, which the
  // counters record); the counters passed are the caller's (or a thread's private) copies.
  auto classify = [&](int64_t i, int64_t &pad, int64_t &bad) -> int64_t {
    const int64_t r = index_at(i);
    int64_t key_row = rows;
    if (r < 0) {
      ++pad;
    } else if (r >= rows) {
      bad = std::min(bad, i);
    } else {
      key_row = r;
    }
    entries[i] = (static_cast<uint64_t>(key_row) << 32) | static_cast<uint64_t>(i);
    return key_row;
  };
  if (bitmap != nullptr) {
    // One serial pass: the bitmap (R / 8 bytes: 244 KiB for 2M rows) stays in L2, and a serial
    // pass (about 1 ms for the seed's 564,096 indices) measured faster and far steadier than
    // atomic or row-partitioned parallel variants on this 2-core machine.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = classify(i, padding, first_bad);
      if (r == rows) continue;
      const uint64_t bit = uint64_t{1} << (r & 63);
      duplicates |= (bitmap[r >> 6] & bit) != 0 ? 1 : 0;
      bitmap[r >> 6] |= bit;
    }
  } else {
    // A table too large for the bitmap: always group by sorting.
    const int nt_pack =
        static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(1, n >> 15)));
#pragma omp parallel for num_threads(nt_pack) schedule(static) reduction(min : first_bad) reduction(+ : padding)
    for (int64_t i = 0; i < n; ++i) classify(i, padding, first_bad);
  }
  if (first_bad < n) {
    const int64_t value = wide ? static_cast<const int64_t *>(idx)[first_bad * stride]
                               : static_cast<const int32_t *>(idx)[first_bad * stride];
    return Status::Invalid(str_cat(kOp, ": indices[", first_bad, "] = ", value,
                                   " but the table has ", rows, " rows; nothing was modified"));
  }
  timer.stage("check");
  st.indices_padding = padding;
  // Without duplicates: the entries in batch order, padding among them (the kernel skips row R).
  // With duplicates: sorted by row, padding last.
  const uint64_t *ordered = entries;
  int64_t end = n;
  if (duplicates != 0) {
    const uint64_t *sorted = radix_sort_u64(entries, entries_tmp, n, 32,
                                            bits_for(static_cast<uint64_t>(rows)), hist, threads_);
    end = n - padding;
    // Put the groups back in batch order, each at the position of its first occurrence, so that
    // the table is walked as in the unique case; only the repeats' gradient rows are extra reads.
    // lead[p] = size of the group whose first occurrence is position p, then its output offset.
    auto *lead = reinterpret_cast<uint32_t *>(base + w.lead);
    uint64_t *out = sorted == entries ? entries_tmp : entries;
    std::memset(lead, 0, static_cast<size_t>(n) * sizeof(uint32_t));
    for (int64_t k = 0; k < end;) {
      int64_t e = k + 1;
      while (e < end && (sorted[e] >> 32) == (sorted[k] >> 32)) ++e;
      lead[sorted[k] & 0xffffffffu] = static_cast<uint32_t>(e - k);
      k = e;
    }
    uint32_t offset = 0;
    for (int64_t p = 0; p < n; ++p) {
      const uint32_t size = lead[p];
      lead[p] = offset;
      offset += size;
    }
    for (int64_t k = 0; k < end;) {
      uint64_t *dst = out + lead[sorted[k] & 0xffffffffu];
      const uint64_t row = sorted[k] >> 32;
      do {
        *dst++ = sorted[k++];
      } while (k < end && (sorted[k] >> 32) == row);
    }
    ordered = out;
  }
  timer.stage(duplicates != 0 ? "group" : "group(none)");

  LazyAdamRowsArgs args;
  args.grad = gradient_.as<const float>();
  args.grad_stride = gradient_.strides[0];
  args.m = m_.as<float>();
  args.m_stride = m_.strides[0];
  args.v = v_.as<float>();
  args.v_stride = v_.strides[0];
  args.var = var_.as<float>();
  args.var_stride = var_.strides[0];
  args.dim = d_;
  args.beta1 = beta1_;
  args.beta2 = beta2_;
  args.one_minus_beta1 = 1.0f - beta1_;
  args.one_minus_beta2 = 1.0f - beta2_;
  args.epsilon = epsilon_;
  args.neg_lr = -lr;
  args.entries = ordered;
  args.row_limit = static_cast<uint64_t>(rows);
  args.prefetch_ahead = prefetch_ahead(d_);
  const LazyAdamRowsFn kernel =
      kernel_ == KernelChoice::kReference ? &lazy_adam_rows_reference : lazy_adam_rows_optimized();

  // Split the entries over threads at row boundaries; each thread owns whole rows.
  const int nt = static_cast<int>(std::clamp<int64_t>(threads_, 1, std::max<int64_t>(1, end / 64)));
  int64_t skipped = 0, distinct = 0;
  char *scratch_base = base + w.scratch;
#pragma omp parallel num_threads(nt) reduction(+ : skipped, distinct)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    auto boundary = [&](int64_t k) {  // the first entry at or after k that starts a row's group
      while (k > 0 && k < end && (ordered[k] >> 32) == (ordered[k - 1] >> 32)) ++k;
      return std::min(k, end);
    };
    const int64_t b = boundary(end * t / team), e = boundary(end * (t + 1) / team);
    if (b < e) {
      if (duplicates != 0) {
        for (int64_t k = b; k < e; ++k)
          distinct += (k == b || (ordered[k] >> 32) != (ordered[k - 1] >> 32)) ? 1 : 0;
      }
      skipped += kernel(
          args, b, e,
          reinterpret_cast<float *>(scratch_base + w.scratch_per_thread * static_cast<size_t>(t)));
    }
  }
  if (duplicates == 0) distinct = n - padding;
  st.rows_skipped_nonfinite = skipped;
  st.rows_updated = distinct - skipped;
  if (timer.on()) {
    timer.stage("update");
    verbose_print(str_cat(
        "LazyAdam,N=", n_, ",R=", r_, ",D=", d_, ",index=", dtype_name(indices_.dtype), ",kernel=",
        kernel_ == KernelChoice::kReference ? "reference" : lazy_adam_optimized_target(),
        ",threads=", threads_, ",rows=", st.rows_updated, ",skipped=", skipped, ",",
        timer.fields()));
  }
  return Status::Ok();
}

Status lazy_adam_step(const TensorView &gradient, const TensorView &indices, const TensorView &m,
                      const TensorView &v, const TensorView &var, float lr,
                      const LazyAdamOptions &options, LazyAdamStats *stats) {
  LazyAdam plan;
  FUSEKIT_RETURN_IF_ERROR(LazyAdam::plan(gradient, indices, m, v, var, options, &plan));
  std::unique_ptr<char[]> workspace;
  if (plan.workspace_size() > 0) {
    workspace.reset(new (std::nothrow) char[plan.workspace_size()]);
    if (!workspace) {
      return Status::Runtime(
          str_cat(kOp, ": could not allocate a workspace of ", plan.workspace_size(), " bytes"));
    }
  }
  return plan.run(lr, workspace.get(), plan.workspace_size(), stats);
}

}  // namespace fusekit
