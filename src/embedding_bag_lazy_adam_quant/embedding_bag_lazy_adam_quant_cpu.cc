// EmbeddingBagLazyAdamQuant on the CPU: the run of the CPU implementations, in stages:
//   check    both maps read once and checked (the dynamic-map format; LazyAdamQuant's);
//   offsets  the embedding-bag optimizers' (common/embedding_bags.h): offsets checked, the bag of
//            every lookup, the bags' scales for mean;
//   check    LazyAdam's pass over the ids, an id < 0 or >= R refused naming the first bad one;
//   tables   LazyAdamQuant's (laq_tables_stage): the maps' search tables, the kernel's own;
//   group    only when some row repeats: LazyAdam's stable radix sort by row, the rows in
//            ascending order (EmbeddingBagLazyAdam's: the table walked by address);
//   update   chunks of whole rows claimed by the threads; each chunk in tiles of up to tile_rows(D)
//            distinct rows (512 at D = 32): the rows' gradients (the scaled grad_output rows of
//            each row's lookups summed in order) into the thread's tile, then LazyAdamQuant's row
//            kernel over the tile, as over a batch of unique rows whose gradient is the tile.
// Nothing is written to the tables before lr, the maps, the offsets and the indices have passed.
// No per-lookup gradient [L, D] exists: a tile is at most 64 KiB of row gradients per thread,
// written and read again while it is in L2.
#include <algorithm>
#include <limits>

#include "common/embedding_bags.h"
#include "common/quant_implementations.h"
#include "common/row_groups.h"
#include "embedding_bag_lazy_adam_quant/embedding_bag_lazy_adam_quant_impl.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "EmbeddingBagLazyAdamQuant";

// A tile row's stride in floats: D rounded up to 16 (64-byte rows).
int64_t tile_stride(int64_t d) {
  return (std::max<int64_t>(d, 1) + 15) / 16 * 16;
}

// Distinct rows per tile: 64 KiB of gradients (512 rows at D = 32), at least 16 (more than the
// kernels' prefetch distance, so that within a tile the kernel's own prefetches cover all but its
// first rows, which the gradient pass prefetches) and at most 512. Each tile is one call of the row
// kernel, which has a cost of its own (its tables into registers, its partial search tiles
// flushed at the end): measured at D = 32, 20k rows, one thread, CPU time against float32
// EmbeddingBagLazyAdam, tiles of 32 / 64 / 128 / 256 / 512 / 1024 / 2048 rows gave 1.60 / 1.43 /
// 1.30 / 1.28 / 1.22 / 1.24 / 1.31 with the dynamic maps (the largest crowd the state out of L2).
int64_t tile_rows(int64_t d) {
  return std::clamp<int64_t>(65536 / (4 * tile_stride(d)), 16, 512);
}

// The workspace: the front stages' part, the tables' part, and per thread the row kernel's scratch,
// the tile of gradients and the tile's entries.
struct WorkspaceLayout {
  BagLayout bags;
  size_t tables = 0, scratch = 0, scratch_per_thread = 0, kernel_scratch = 0, tile_bytes = 0,
         total = 0;
};

WorkspaceLayout layout_for(const EmbeddingBagLazyAdamQuantProblem &p, int64_t bags, int64_t lookups,
                           int threads, bool with_lut) {
  WorkspaceLayout w;
  w.bags = bag_layout(bags, lookups, p.rows, p.pooling == PoolingMode::kMean, threads);
  size_t off = w.bags.end;
  w.tables = off;
  off += laq_tables_bytes(with_lut);
  w.scratch = off;
  w.kernel_scratch = align_up(lazy_adam_quant_scratch_bytes(std::max<int64_t>(p.d, 1)));
  w.tile_bytes = static_cast<size_t>(tile_rows(p.d) * tile_stride(p.d)) * sizeof(float);
  w.scratch_per_thread = w.kernel_scratch + w.tile_bytes +
                         align_up(static_cast<size_t>(tile_rows(p.d)) * sizeof(uint64_t));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return w;
}

bool wants_lut(const EmbeddingBagLazyAdamQuantProblem &p, QuantSearch search, int64_t lookups) {
  return p.state_format == QuantStateFormat::kDynamicMap &&
         quant_wants_table(search, lookups * p.d);
}

// Every cache line of the state of table row r: var, both code rows, both absmax rows.
void prefetch_state(const LazyAdamQuantRowsArgs &a, int64_t r) {
  const auto lines = [](const void *p, int64_t bytes) {
    const auto *c = static_cast<const char *>(p);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1);
    __builtin_prefetch(c + bytes - 1, 1);
  };
  lines(static_cast<const char *>(a.var) + r * a.var_stride * dtype_size(a.dtype),
        a.dim * static_cast<int64_t>(dtype_size(a.dtype)));
  lines(a.m + r * a.m_stride, a.dim);
  lines(a.v + r * a.v_stride, a.dim);
  lines(a.absmax_m + r * a.absmax_m_stride, a.blocks * 4);
  lines(a.absmax_v + r * a.absmax_v_stride, a.blocks * 4);
}

// The rows of entries[begin, end) (whole rows), tile by tile: the gradients, then the row step.
// step_args: the row step's arguments, whose grad and entries become the tile's. Returns the rows
// skipped.
int64_t update_tiles(const LazyAdamQuantRowsArgs &step_args, const LaqRowStep &step,
                     const BagGradientArgs &bags, BagRowGradientFn gradient,
                     const uint64_t *entries, int64_t begin, int64_t end, char *scratch,
                     const WorkspaceLayout &w) {
  LazyAdamQuantRowsArgs a = step_args;
  auto *tile = reinterpret_cast<float *>(scratch + w.kernel_scratch);
  auto *tile_entries = reinterpret_cast<uint64_t *>(scratch + w.kernel_scratch + w.tile_bytes);
  const int64_t stride = tile_stride(a.dim), rows = tile_rows(a.dim);
  a.grad = tile;
  a.grad_stride = stride;
  a.grad_dtype = DType::kFloat32;
  a.entries = tile_entries;
  int64_t skipped = 0;
  for (int64_t k = begin; k < end;) {
    int64_t n = 0;
    for (; k < end && n < rows; ++n) {
      const uint64_t row = entries[k] >> 32;
      // The rows the kernel reaches before its own prefetches do.
      if (n < step.prefetch_ahead) prefetch_state(a, static_cast<int64_t>(row));
      k = gradient(bags, entries, k, end, a.dim, tile + n * stride);
      tile_entries[n] = row << 32 | static_cast<uint64_t>(n);
    }
    skipped += step.rows(a, 0, n, scratch);
  }
  return skipped;
}

// The CPU run, as common/quant_implementations.h's list asks for it.
struct Cpu {
  static const char *avx512vbmi_why_not(const EmbeddingBagLazyAdamQuantProblem &p) {
    return laq_avx512vbmi_why_not(p.state_format);
  }

  static size_t run_workspace_bytes(const EmbeddingBagLazyAdamQuantProblem &p,
                                    const EmbeddingBagLazyAdamQuantTensors &t, int threads,
                                    QuantSearch search) {
    const int64_t bags = t.grad_output.shape[0], lookups = t.indices.shape[0];
    if (bag_batch_is_empty(bags, lookups)) return 0;  // no lookups: no workspace
    if (bag_batch_too_large(bags, lookups)) return std::numeric_limits<size_t>::max();
    return layout_for(p, bags, lookups, threads, wants_lut(p, search, lookups)).total;
  }

  static Status run(QuantKernelKind kind, QuantSearch search,
                    const EmbeddingBagLazyAdamQuantProblem &p,
                    const EmbeddingBagLazyAdamQuantTensors &t,
                    const EmbeddingBagLazyAdamQuantScalars &s, const RunContext &ctx,
                    EmbeddingBagLazyAdamQuantStats *stats) {
    const LaqRowStep step = laq_row_step(kind, search, p.state_format, p.desc.var.dtype, p.d);
    float lr = 0;
    FUSEKIT_RETURN_IF_ERROR(host_lr(kOp, s.lr, s.lr_tensor, &lr));
    EmbeddingBagLazyAdamQuantStats &st = *stats;
    StageTimer &timer = *ctx.timer;
    const int threads = ctx.threads;
    const int64_t bags = t.grad_output.shape[0], lookups = t.indices.shape[0], rows = p.rows;

    // ---- check: both maps, read once (the FP8 format has none) ----
    const bool fp8 = p.state_format == QuantStateFormat::kFp8;
    alignas(64) float maps[2][kQuantMapSize];
    if (!fp8) FUSEKIT_RETURN_IF_ERROR(read_quant_maps(kOp, t.qmap_m, t.qmap_v, maps));

    // ---- offsets, check ----
    const bool with_lut = wants_lut(p, step.search, lookups);
    const WorkspaceLayout w = layout_for(p, bags, lookups, threads, with_lut);
    char *base = ctx.workspace;
    RowEntries e;
    BagGradientArgs bag_args;
    FUSEKIT_RETURN_IF_ERROR(bag_front_stages(
        kOp, t.grad_output, t.indices, t.offsets, t.per_sample_weights, p.weighted,
        p.pooling == PoolingMode::kMean, rows, base, w.bags, threads, &e, &bag_args, timer));
    // No lookups, or rows of no columns: the batch was checked, there is nothing to update.
    if (lookups == 0 || p.d == 0) return Status::Ok();

    // ---- tables ----
    LazyAdamQuantRowsArgs a;
    laq_tables_stage(step, fp8, maps, with_lut, base + w.tables, timer, &a);
    a.guard_lost_v = p.guard_lost_v;

    // ---- group: only when some row is named twice, in row order (unweighted, the entries carry
    // the bags) ----
    bag_entries_hold_bags(e, lookups, threads, &bag_args);
    bag_group_stage(rows, base, w.bags, threads, &e, timer);

    // ---- update ----
    set_laq_state_args(t.m, t.v, t.var, t.absmax_m, t.absmax_v, p.blocks, &a);
    set_row_step_args(p, lr, e, rows, step.prefetch_ahead, &a);
    const BagRowGradientFn gradient =
        kind == QuantKernelKind::kReference ? &bag_row_gradient_reference : bag_row_gradient_hwy();
    update_row_chunks(e, threads, base + w.scratch, w.scratch_per_thread, &st.rows_updated,
                      &st.rows_skipped_nonfinite, [&](int64_t b, int64_t en, char *scratch) {
                        return update_tiles(a, step, bag_args, gradient, e.entries, b, en, scratch,
                                            w);
                      });
    timer.stage("update");
    return Status::Ok();
  }
};

}  // namespace

std::span<const EmbeddingBagLazyAdamQuantImpl *const>
embedding_bag_lazy_adam_quant_cpu_implementations() {
  return QuantImplementations<EmbeddingBagLazyAdamQuantOp, Cpu>::list();
}

}  // namespace fusekit
