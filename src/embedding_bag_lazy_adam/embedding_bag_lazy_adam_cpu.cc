// EmbeddingBagLazyAdam on the CPU: the run of the CPU implementations, in stages (the check and
// group stages are LazyAdam's, common/row_groups.h):
//   offsets  one pass over the offsets: offsets[0] = 0, non-decreasing, offsets[B] = L, else
//            refused; then the bag of every lookup (L uint32) and, for mean, each bag's
//            1 / float32(len) (B floats);
//   check    one pass over the indices: the range check (negative or >= R: refused, naming the
//            first bad position), the entries (row << 32 | lookup), whether any row repeats;
//   group    only when some row repeats: the stable radix sort by row, so that the lookups of a
//            row are neighbours in order of occurrence;
//   update   the row kernel over chunks of entries claimed by the threads, each chunk whole rows:
//            per row, g from grad_output's rows (scaled) summed in order, then LazyAdam's step.
// Nothing is written to the tables before the offsets, the indices and lr have passed; no
// per-lookup gradient [L, D] exists anywhere (one row of scratch per thread).
#include <algorithm>
#include <cstring>
#include <limits>

#include "common/row_groups.h"
#include "common/str_cat.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "EmbeddingBagLazyAdam";

// The workspace: the row groups' part, the bag of each lookup, the bags' scales (mean), one
// gradient row of scratch per thread.
struct WorkspaceLayout {
  RowGroupsLayout groups;
  size_t bag_of = 0, bag_scale = 0, scratch = 0, scratch_per_thread = 0, total = 0;
};

WorkspaceLayout layout_for(int64_t bags, int64_t lookups, int64_t d, int64_t rows, bool mean,
                           int threads) {
  WorkspaceLayout w;
  w.groups = row_groups_layout(lookups, rows, threads);
  size_t off = w.groups.total;
  w.bag_of = off;
  off += align_up(static_cast<size_t>(lookups) * sizeof(uint32_t));
  w.bag_scale = off;
  if (mean) off += align_up(static_cast<size_t>(bags) * sizeof(float));
  w.scratch = off;
  w.scratch_per_thread = align_up(static_cast<size_t>(std::max<int64_t>(d, 1)) * sizeof(float));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return w;
}

// Element i of an int32 or int64 vector with any stride.
struct IntReader {
  const void *data;
  int64_t stride;
  bool wide;
  int64_t operator()(int64_t i) const {
    return wide ? static_cast<const int64_t *>(data)[i * stride]
                : static_cast<const int32_t *>(data)[i * stride];
  }
};
IntReader reader_of(const TensorView &t) {
  return {t.data, t.strides[0], t.dtype == DType::kInt64};
}

// The offsets stage's check: offsets[0] = 0, non-decreasing, offsets[B] = L (read only).
Status check_offsets(const IntReader &off, int64_t bags, int64_t lookups) {
  if (off(0) != 0) {
    return Status::Invalid(str_cat(kOp, ": offsets[0] = ", off(0),
                                   " but the first bag must start at 0; nothing was modified"));
  }
  for (int64_t b = 0; b < bags; ++b) {
    if (off(b + 1) < off(b)) {
      return Status::Invalid(str_cat(kOp, ": offsets[", b + 1, "] = ", off(b + 1), " < offsets[", b,
                                     "] = ", off(b),
                                     ": offsets must be non-decreasing; nothing was modified"));
    }
  }
  if (off(bags) != lookups) {
    return Status::Invalid(str_cat(kOp, ": offsets[", bags, "] = ", off(bags), " but indices has ",
                                   lookups,
                                   " entries: the last offset must be the number of lookups; "
                                   "nothing was modified"));
  }
  return Status::Ok();
}

// The first index out of [0, rows), as a refusal (the check stage found one).
Status refuse_first_bad_index(const TensorView &indices, int64_t rows) {
  const IntReader idx = reader_of(indices);
  const int64_t n = indices.shape[0];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx(i);
    if (r < 0) {
      return Status::Invalid(str_cat(kOp, ": indices[", i, "] = ", r,
                                     " is negative (ids are rows 0 .. R - 1; a lookup to skip is "
                                     "left out of its bag); nothing was modified"));
    }
    if (r >= rows) {
      return Status::Invalid(str_cat(kOp, ": indices[", i, "] = ", r, " but the table has ", rows,
                                     " rows; nothing was modified"));
    }
  }
  return Status::Invalid(str_cat(kOp, ": an index is out of range; nothing was modified"));
}

}  // namespace

size_t embedding_bag_lazy_adam_cpu_run_workspace_bytes(const EmbeddingBagLazyAdamProblem &p,
                                                       const EmbeddingBagLazyAdamTensors &t,
                                                       int threads) {
  const int64_t bags = t.grad_output.shape[0], lookups = t.indices.shape[0];
  if (bags < 0 || lookups <= 0) return 0;  // no lookups: no workspace
  constexpr auto kMax = int64_t{1} << 32;  // (the problem refuses more)
  if (bags >= kMax || lookups >= kMax) return std::numeric_limits<size_t>::max();
  return layout_for(bags, lookups, p.d, p.rows, p.pooling == PoolingMode::kMean, threads).total;
}

Status embedding_bag_lazy_adam_cpu_run(EmbeddingBagLazyAdamRowsFn kernel, int64_t prefetch_ahead,
                                       const EmbeddingBagLazyAdamProblem &p,
                                       const EmbeddingBagLazyAdamTensors &t,
                                       const EmbeddingBagLazyAdamScalars &s, const RunContext &ctx,
                                       EmbeddingBagLazyAdamStats *stats) {
  float lr = 0;
  FUSEKIT_RETURN_IF_ERROR(host_lr(kOp, s.lr, s.lr_tensor, &lr));
  EmbeddingBagLazyAdamStats &st = *stats;
  const int64_t bags = t.grad_output.shape[0], lookups = t.indices.shape[0], rows = p.rows;
  StageTimer &timer = *ctx.timer;
  const int threads = ctx.threads;
  const bool mean = p.pooling == PoolingMode::kMean;

  // ---- offsets: checked, then the bag of every lookup and the bags' scales ----
  const IntReader off = reader_of(t.offsets);
  FUSEKIT_RETURN_IF_ERROR(check_offsets(off, bags, lookups));
  if (lookups == 0) {  // empty bags only: nothing to update
    timer.stage("offsets");
    return Status::Ok();
  }
  const WorkspaceLayout w = layout_for(bags, lookups, p.d, rows, mean, threads);
  char *base = ctx.workspace;
  auto *bag_of = reinterpret_cast<uint32_t *>(base + w.bag_of);
  auto *bag_scale = reinterpret_cast<float *>(base + w.bag_scale);
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t lo = off(b), hi = off(b + 1);
    for (int64_t i = lo; i < hi; ++i) bag_of[i] = static_cast<uint32_t>(b);
    if (mean) bag_scale[b] = hi > lo ? 1.0f / static_cast<float>(hi - lo) : 0.0f;
  }
  timer.stage("offsets");

  // ---- check: every index in [0, R), and the entries (row << 32 | lookup) ----
  RowEntries e;
  const Status checked = row_groups_check(kOp, t.indices, rows, base, w.groups, threads, &e, timer);
  // row_groups_check takes negative ids as padding; here they are refused, like ids >= R, naming
  // the first bad position of either kind.
  if (!checked.ok() || e.padding > 0) return refuse_first_bad_index(t.indices, rows);
  // Rows of no columns: the batch was checked, there is nothing to update.
  if (p.d == 0) return Status::Ok();

  // Unweighted, a lookup's bag is all the kernel needs of it: the entries carry the bag instead of
  // the lookup (no bag_of[i] read per lookup in the update, where the lookups come in row order).
  const bool entries_hold_bags = !p.weighted;
  if (entries_hold_bags) {
    auto *entries = const_cast<uint64_t *>(e.entries);  // the workspace's, written by check
    parallel_for(lookups, threads, int64_t{1} << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        entries[i] = (entries[i] & ~uint64_t{0xffffffffu}) | bag_of[i];
    });
  }

  // ---- group: only when some row is named twice; in row order (the table walked by address,
  // the bags' gradient rows read from cache) ----
  row_groups_group(rows, base, w.groups, threads, &e, timer, GroupOrder::kRow);

  // ---- update ----
  EmbeddingBagLazyAdamRowsArgs args;
  args.grad_output = t.grad_output.as<const float>();
  args.grad_stride = t.grad_output.strides[0];
  args.bag_of = entries_hold_bags ? nullptr : bag_of;
  args.bag_scale = mean ? bag_scale : nullptr;
  args.weights = p.weighted ? t.per_sample_weights.as<const float>() : nullptr;
  args.weight_stride = p.weighted ? t.per_sample_weights.strides[0] : 0;
  args.m = t.m.as<float>();
  args.m_stride = t.m.strides[0];
  args.v = t.v.as<float>();
  args.v_stride = t.v.strides[0];
  args.var = t.var.as<float>();
  args.var_stride = t.var.strides[0];
  set_row_step_args(p, lr, e, rows, prefetch_ahead, &args);
  update_row_chunks(e, threads, base + w.scratch, w.scratch_per_thread, &st.rows_updated,
                    &st.rows_skipped_nonfinite, [&](int64_t b, int64_t en, char *scratch) {
                      return kernel(args, b, en, reinterpret_cast<float *>(scratch));
                    });
  timer.stage("update");
  return Status::Ok();
}

}  // namespace fusekit
