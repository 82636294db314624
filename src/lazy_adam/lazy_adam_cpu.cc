// LazyAdam on the CPU: the run of the CPU implementations, in stages (common/row_groups.h, shared
// with LazyAdamQuant):
//   check   one pass over the indices: range check (nothing is written before it passes), the
//           entries (row << 32 | position), and a bitmap over the table's rows that tells whether
//           any row is named twice;
//   group   only when some row is named twice: a stable radix sort of the entries by row, so that
//           the occurrences of a row become neighbours in order of occurrence (summed, applied
//           once), then the groups put back in batch order;
//   update  the row kernel over chunks of entries claimed by the threads, each chunk whole rows.
// Without duplicates (what Rec SDK's Python layer hands the operator) the table is walked in the
// order of the indices: measured here, that beats the sorted walk by 1.6x, since the gradient is
// then read sequentially and the three table rows are prefetched ahead.
#include <algorithm>
#include <cstring>

#include "common/row_groups.h"
#include "lazy_adam/lazy_adam_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "LazyAdam";

// The workspace: the stages' part (common/row_groups.h), then one gradient row of scratch per
// thread.
struct WorkspaceLayout {
  RowGroupsLayout groups;
  size_t scratch = 0, scratch_per_thread = 0, total = 0;
};

WorkspaceLayout layout_for(int64_t n, int64_t d, int64_t rows, int threads) {
  WorkspaceLayout w;
  w.groups = row_groups_layout(n, rows, threads);
  size_t off = w.groups.total;
  w.scratch = off;
  w.scratch_per_thread = align_up(static_cast<size_t>(std::max<int64_t>(d, 1)) * sizeof(float));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return w;
}

}  // namespace

void set_lazy_adam_bitmap_limit_for_testing(int64_t bytes) {
  set_row_groups_bitmap_limit_for_testing(bytes);
}

size_t lazy_adam_cpu_workspace_bytes(const LazyAdamProblem &p, int threads) {
  return p.n == 0 ? 0 : layout_for(p.n, p.d, p.rows, threads).total;
}

Status lazy_adam_cpu_run(LazyAdamRowsFn kernel, int64_t prefetch_ahead, const LazyAdamProblem &p,
                         const LazyAdamTensors &t, const LazyAdamScalars &s, const RunContext &ctx,
                         LazyAdamStats *stats) {
  float lr = 0;
  FUSEKIT_RETURN_IF_ERROR(host_lr(LazyAdamOp::kName, s.lr, s.lr_tensor, &lr));
  LazyAdamStats &st = *stats;
  const int64_t n = p.n, rows = p.rows;
  if (n == 0) return Status::Ok();
  StageTimer &timer = *ctx.timer;
  const int threads = ctx.threads;
  const WorkspaceLayout w = layout_for(n, p.d, rows, threads);
  char *base = ctx.workspace;

  // ---- check: every index, and the entries (row << 32 | position); padding gets row R ----
  RowEntries e;
  FUSEKIT_RETURN_IF_ERROR(
      row_groups_check(kOp, t.indices, rows, base, w.groups, threads, &e, timer));
  st.indices_padding = e.padding;
  // Rows of no columns: the indices were checked, there is nothing to update (and the tables may
  // have no data at all).
  if (p.d == 0) return Status::Ok();

  // ---- group: only when some row is named twice ----
  row_groups_group(rows, base, w.groups, threads, &e, timer);

  // ---- update ----
  LazyAdamRowsArgs args;
  args.grad = t.gradient.as<const float>();
  args.grad_stride = t.gradient.strides[0];
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
