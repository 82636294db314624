// The sparse-row optimizers' check and group stages (common/row_groups.h), moved here from
// LazyAdam's CPU run unchanged so that LazyAdamQuant runs the same ones.
#include "common/row_groups.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/implementation.h"
#include "common/radix_sort.h"
#include "common/str_cat.h"

namespace fusekit {
namespace {

// The duplicate bitmap costs rows / 8 bytes; past this it is not worth it and every batch is
// grouped by sorting instead.
std::atomic<int64_t> g_max_bitmap_bytes{int64_t{64} << 20};

}  // namespace

void set_row_groups_bitmap_limit_for_testing(int64_t bytes) {
  g_max_bitmap_bytes.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
}

RowGroupsLayout row_groups_layout(int64_t n, int64_t rows, int threads) {
  RowGroupsLayout w;
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
  w.total = off;
  return w;
}

Status row_groups_check(const char *op, const TensorView &indices, int64_t rows, char *base,
                        const RowGroupsLayout &w, int threads, RowEntries *out, StageTimer &timer) {
  const int64_t n = indices.shape[0];
  auto *entries = reinterpret_cast<uint64_t *>(base + w.entries);
  uint64_t *bitmap = w.bitmap_bytes > 0 ? reinterpret_cast<uint64_t *>(base + w.bitmap) : nullptr;
  if (bitmap != nullptr) std::memset(bitmap, 0, w.bitmap_bytes);

  const int64_t stride = indices.strides[0];
  const bool wide = indices.dtype == DType::kInt64;
  const void *idx = indices.data;
  int64_t first_bad = n, padding = 0;
  int duplicates = bitmap == nullptr ? 1 : 0;
  auto index_at = [&](int64_t i) -> int64_t {
    return wide ? static_cast<const int64_t *>(idx)[i * stride]
                : static_cast<const int32_t *>(idx)[i * stride];
  };
  // Writes entry i and returns its row (R for padding and for an index out of range, which the
  // counters record); the counters passed are the caller's (or a chunk's private) copies.
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
    std::atomic<int64_t> bad_all{n}, pad_all{0};
    parallel_for(n, threads, int64_t{1} << 15, [&](int64_t b, int64_t e, int) {
      int64_t pad = 0, bad = n;
      for (int64_t i = b; i < e; ++i) classify(i, pad, bad);
      pad_all.fetch_add(pad, std::memory_order_relaxed);
      for (int64_t cur = bad_all.load(); bad < cur && !bad_all.compare_exchange_weak(cur, bad);) {
      }
    });
    first_bad = bad_all.load();
    padding = pad_all.load();
  }
  if (first_bad < n) {
    return Status::Invalid(str_cat(op, ": indices[", first_bad, "] = ", index_at(first_bad),
                                   " but the table has ", rows, " rows; nothing was modified"));
  }
  out->entries = entries;
  out->end = n;
  out->duplicates = duplicates != 0;
  out->padding = padding;
  timer.stage("check");
  return Status::Ok();
}

void row_groups_group(int64_t rows, char *base, const RowGroupsLayout &w, int threads,
                      RowEntries *e, StageTimer &timer, GroupOrder order) {
  if (!e->duplicates) {
    timer.stage("group(none)");
    return;
  }
  const int64_t n = e->end, padding = e->padding;
  auto *entries = reinterpret_cast<uint64_t *>(base + w.entries);
  auto *entries_tmp = reinterpret_cast<uint64_t *>(base + w.entries_tmp);
  auto *hist = reinterpret_cast<uint64_t *>(base + w.hist);
  // Sorted by row, padding last, then the groups put back in batch order, each at the position of
  // its first occurrence, so that the table is walked as in the unique case; only the repeats'
  // gradient rows are extra reads.
  const uint64_t *sorted = radix_sort_u64(entries, entries_tmp, n, 32,
                                          bits_for(static_cast<uint64_t>(rows)), hist, threads);
  const int64_t end = n - padding;
  if (order == GroupOrder::kRow) {
    e->entries = sorted;
    e->end = end;
    timer.stage("group");
    return;
  }
  // lead[p] = size of the group whose first occurrence is position p, then its output offset.
  auto *lead = reinterpret_cast<uint32_t *>(base + w.lead);
  uint64_t *out = sorted == entries ? entries_tmp : entries;
  std::memset(lead, 0, static_cast<size_t>(n) * sizeof(uint32_t));
  for (int64_t k = 0; k < end;) {
    int64_t f = k + 1;
    while (f < end && (sorted[f] >> 32) == (sorted[k] >> 32)) ++f;
    lead[sorted[k] & 0xffffffffu] = static_cast<uint32_t>(f - k);
    k = f;
  }
  uint32_t offset = 0;
  for (int64_t q = 0; q < n; ++q) {
    const uint32_t size = lead[q];
    lead[q] = offset;
    offset += size;
  }
  for (int64_t k = 0; k < end;) {
    uint64_t *dst = out + lead[sorted[k] & 0xffffffffu];
    const uint64_t row = sorted[k] >> 32;
    do {
      *dst++ = sorted[k++];
    } while (k < end && (sorted[k] >> 32) == row);
  }
  e->entries = out;
  e->end = end;
  timer.stage("group");
}

Status check_float_row_table(const char *op, const TensorView &t, const char *name) {
  if (t.dtype != DType::kFloat32) {
    return Status::Invalid(
        str_cat(op, ": ", name, " has dtype ", dtype_name(t.dtype), "; only float32 is supported"));
  }
  if (t.ndim != 2) {
    return Status::Invalid(str_cat(op, ": ", name, " must be 2-D, got shape ", t.shape_string()));
  }
  if (!t.inner_contiguous()) {
    return Status::Invalid(str_cat(op, ": ", name,
                                   " must have a contiguous last dimension, got strides [",
                                   t.strides[0], ", ", t.strides[1], "]"));
  }
  if (t.shape[0] < 0 || t.shape[1] < 0) {
    return Status::Invalid(
        str_cat(op, ": ", name, " has a negative size in shape ", t.shape_string()));
  }
  if (t.strides[0] < 0) {
    return Status::Invalid(str_cat(op, ": ", name, " has a negative row stride ", t.strides[0]));
  }
  if (row_table_span_overflows(t)) {  // (a one-row table may have any row stride)
    return Status::Invalid(
        str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  return Status::Ok();
}

}  // namespace fusekit
