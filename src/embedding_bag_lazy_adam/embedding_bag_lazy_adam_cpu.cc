// EmbeddingBagLazyAdam on the CPU: the run of the CPU implementations, in stages (offsets and
// check are the embedding-bag optimizers', common/embedding_bags.h; check and group are LazyAdam's,
// common/row_groups.h):
//   offsets  one pass over the offsets: offsets[0] = 0, non-decreasing, offsets[B] = L, else
//            refused; then the bag of every lookup (L uint32) and, for mean, each bag's
//            1 / float32(len) (B floats);
//   check    one pass over the indices: the range check (negative or >= R: refused, naming the
//            first bad position), the entries (row << 32 | lookup), whether any row repeats;
//   group    only when some row repeats: the stable radix sort by row, so that the lookups of a
//            row are neighbours in order of occurrence, the rows kept in ascending order (the
//            table walked by address); before it, unweighted, the entries carry the bag instead of
//            the lookup;
//   update   the row kernel over chunks of entries claimed by the threads, each chunk whole rows:
//            per row, g from grad_output's rows (scaled) summed in order, then LazyAdam's step.
// Nothing is written to the tables before the offsets, the indices and lr have passed; no
// per-lookup gradient [L, D] exists anywhere (one row of scratch per thread).
#include <algorithm>
#include <cstring>
#include <limits>

#include "common/embedding_bags.h"
#include "common/row_groups.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "EmbeddingBagLazyAdam";

// The workspace: the front stages' part (common/embedding_bags.h), one gradient row of scratch per
// thread.
struct WorkspaceLayout {
  BagLayout bags;
  size_t scratch = 0, scratch_per_thread = 0, total = 0;
};

WorkspaceLayout layout_for(int64_t bags, int64_t lookups, int64_t d, int64_t rows, bool mean,
                           int threads) {
  WorkspaceLayout w;
  w.bags = bag_layout(bags, lookups, rows, mean, threads);
  size_t off = w.bags.end;
  w.scratch = off;
  w.scratch_per_thread = align_up(static_cast<size_t>(std::max<int64_t>(d, 1)) * sizeof(float));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return w;
}

}  // namespace

size_t embedding_bag_lazy_adam_cpu_run_workspace_bytes(const EmbeddingBagLazyAdamProblem &p,
                                                       const EmbeddingBagLazyAdamTensors &t,
                                                       int threads) {
  const int64_t bags = t.grad_output.shape[0], lookups = t.indices.shape[0];
  if (bag_batch_is_empty(bags, lookups)) return 0;  // no lookups: no workspace
  if (bag_batch_too_large(bags, lookups)) return std::numeric_limits<size_t>::max();
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

  // ---- offsets, check: nothing is written before they pass ----
  const WorkspaceLayout w = layout_for(bags, lookups, p.d, rows, mean, threads);
  char *base = ctx.workspace;
  RowEntries e;
  EmbeddingBagLazyAdamRowsArgs args;
  FUSEKIT_RETURN_IF_ERROR(bag_front_stages(kOp, t.grad_output, t.indices, t.offsets,
                                           t.per_sample_weights, p.weighted, mean, rows, base,
                                           w.bags, threads, &e, &args.bags, timer));
  // No lookups, or rows of no columns: the batch was checked, there is nothing to update.
  if (lookups == 0 || p.d == 0) return Status::Ok();

  // Unweighted: the entries carry the bags; then the group stage, in row order (the table walked
  // by address, the bags' gradient rows read from cache).
  bag_entries_hold_bags(e, lookups, threads, &args.bags);
  bag_group_stage(rows, base, w.bags, threads, &e, timer);

  // ---- update ----
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
