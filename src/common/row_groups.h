// fusekit internal: the stages that the sparse-row optimizers (LazyAdam, LazyAdamQuant) run before
// their row kernels, written once:
//   check   one pass over the indices: the range check (nothing is written before it passes), the
//           entries (row << 32 | position; padding gets row R), and a bitmap over the table's rows
//           that tells whether any row is named twice;
//   group   only when some row is named twice: a stable radix sort of the entries by row, so that
//           the occurrences of a row become neighbours in order of occurrence (summed, applied
//           once), then (GroupOrder::kBatch) the groups put back in batch order, each at the
//           position of its first occurrence, padding last (outside [0, end));
//   update  the grouped entries cut into chunks at row boundaries (each chunk owns whole rows),
//           claimed by the threads (update_row_chunks).
// Without duplicates the entries stay in batch order, padding among them (the kernels skip row R):
// the gradient is then read sequentially and the table rows are prefetched ahead.
#ifndef FUSEKIT_COMMON_ROW_GROUPS_H_
#define FUSEKIT_COMMON_ROW_GROUPS_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/parallel.h"
#include "common/verbose.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Where the stages keep their data in a workspace (offsets from its 64-aligned start): the
// duplicate bitmap (when the table is small enough), the entries and their sort buffer, the sort's
// histograms, the group offsets. `total` (a multiple of 64) is where the operator's own part of the
// workspace may start.
struct RowGroupsLayout {
  size_t bitmap = 0, bitmap_bytes = 0, entries = 0, entries_tmp = 0, hist = 0, lead = 0, total = 0;
};
RowGroupsLayout row_groups_layout(int64_t n, int64_t rows, int threads);

// The entries to walk: entries[0, end), each row's occurrences neighbours in order of occurrence,
// rows in the batch order of their first occurrence; entries with row >= R are padding.
struct RowEntries {
  const uint64_t *entries = nullptr;
  int64_t end = 0;
  bool duplicates = false;  // some row is named twice (then the entries were grouped)
  int64_t padding = 0;      // negative indices
};

// The check stage over indices (int32 or int64, [N] or [N, 1], any stride; N = indices.shape[0])
// into a table of `rows` rows. An index >= rows is kInvalidArgument naming the first such position
// and its value: "<op>: indices[7] = 64 but the table has 64 rows; nothing was modified". Fills
// out (entries in batch order, padding counted, whether any row repeats). Ends the stage "check"
// on `timer` when it passes.
Status row_groups_check(const char *op, const TensorView &indices, int64_t rows, char *workspace,
                        const RowGroupsLayout &layout, int threads, RowEntries *out,
                        StageTimer &timer);
// The order of the groups after the group stage: kBatch, each row's group at the position of its
// first occurrence (the sparse-row optimizers, whose gradient rows are as many as the entries:
// read in batch order, sequentially); kRow, ascending row (EmbeddingBagLazyAdam, whose gradient
// rows, the bags', are few and stay in cache: the table is walked in address order instead).
// Within a group the occurrences are in batch order either way.
enum class GroupOrder { kBatch, kRow };
// The group stage: when out->duplicates, sorts and regroups the entries (out->entries and end
// change; the stage "group"); else nothing ("group(none)").
void row_groups_group(int64_t rows, char *workspace, const RowGroupsLayout &layout, int threads,
                      RowEntries *inout, StageTimer &timer, GroupOrder order = GroupOrder::kBatch);

// The update stage: chunks of about a quarter of a thread's share of entries, cut at row
// boundaries, claimed by the threads; fn(begin, end, scratch) runs the row kernel over
// entries[begin, end) (whole rows) with the worker's `scratch_per_thread` bytes at `scratch` and
// returns the rows it skipped. Sets *updated to the distinct rows written and *skipped to those
// left unchanged.
template <typename Fn>
void update_row_chunks(const RowEntries &e, int threads, char *scratch, size_t scratch_per_thread,
                       int64_t *updated, int64_t *skipped, Fn &&fn) {
  const uint64_t *ordered = e.entries;
  const int64_t end = e.end;
  auto boundary = [&](int64_t k) {  // the first entry at or after k that starts a row's group
    while (k > 0 && k < end && (ordered[k] >> 32) == (ordered[k - 1] >> 32)) ++k;
    return std::min(k, end);
  };
  const int64_t size = chunk_size_for(end, threads, 256);
  const int64_t chunks = (end + size - 1) / size;
  std::atomic<int64_t> skip{0}, distinct{0};
  parallel_chunks(chunks, threads, [&](int64_t c, int worker) {
    const int64_t b = boundary(c * size), en = boundary((c + 1) * size);
    if (b >= en) return;
    if (e.duplicates) {
      int64_t groups = 0;
      for (int64_t k = b; k < en; ++k)
        groups += (k == b || (ordered[k] >> 32) != (ordered[k - 1] >> 32)) ? 1 : 0;
      distinct.fetch_add(groups, std::memory_order_relaxed);
    }
    char *own = scratch + scratch_per_thread * static_cast<size_t>(worker);
    skip.fetch_add(fn(b, en, own), std::memory_order_relaxed);
  });
  *skipped = skip.load();
  *updated = (e.duplicates ? distinct.load() : end - e.padding) - *skipped;
}

// The step's fields of a sparse-row kernel's arguments (LazyAdamRowsArgs, LazyAdamQuantRowsArgs):
// the row width and Adam's constants of the problem, lr, the entries to walk.
template <class Args, class Problem>
void set_row_step_args(const Problem &p, float lr, const RowEntries &e, int64_t rows,
                       int64_t prefetch_ahead, Args *a) {
  a->dim = p.d;
  a->beta1 = p.beta1;
  a->beta2 = p.beta2;
  a->one_minus_beta1 = 1.0f - p.beta1;
  a->one_minus_beta2 = 1.0f - p.beta2;
  a->epsilon = p.epsilon;
  a->neg_lr = -lr;
  a->entries = e.entries;
  a->row_limit = static_cast<uint64_t>(rows);
  a->prefetch_ahead = prefetch_ahead;
}

// Whether the bytes a 2-D table [rows, cols] (or a gradient) reaches from its data pointer,
// ((rows - 1) * row stride + cols) * element size, overflow 64 bits; sizes and the row stride are
// >= 0 (checked before). Only that span counts: a one-row table never steps by its row stride, so
// any row stride is valid for it (2^62 - 1 included), while a table whose span overflows cannot
// exist. Within the span, the kernels' row offsets r * stride (0 <= r < rows) cannot overflow;
// the kernels form them for rows that exist only (a padding entry's row R is never addressed).
inline bool row_table_span_overflows(const TensorView &t) {
  if (t.shape[0] == 0 || t.shape[1] == 0) return false;  // nothing is addressed
  const auto es = static_cast<int64_t>(std::max<size_t>(dtype_size(t.dtype), 1));
  int64_t span = 0;
  return __builtin_mul_overflow(t.shape[0] - 1, t.strides[0], &span) ||
         __builtin_add_overflow(span, t.shape[1], &span) || __builtin_mul_overflow(span, es, &span);
}

// A float32 2-D table of rows (LazyAdam's var, m, v and gradient; EmbeddingBagLazyAdam's table and
// grad_output), named `name` in `op`'s messages: float32, 2-D, a contiguous last dimension,
// sizes and row stride >= 0, a span that fits 64 bits.
Status check_float_row_table(const char *op, const TensorView &t, const char *name);

// Tests only: plans made after this use the duplicate bitmap up to `bytes` (default 64 MiB, or 8
// bytes per index if more); a negative value disables it, so every batch is grouped by sorting.
void set_row_groups_bitmap_limit_for_testing(int64_t bytes);

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_ROW_GROUPS_H_
