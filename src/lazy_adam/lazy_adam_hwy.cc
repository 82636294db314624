// LazyAdam, the optimized kernel: Highway SIMD over the row, compiled for every x86 target Highway
// builds and dispatched at run time; prefetches the rows of the entries a few steps ahead. Same
// float32 operations in the same order as the reference kernel (no FMA: bitwise equal results).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lazy_adam/lazy_adam_hwy.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "common/hwy_dispatch.h"
#include "lazy_adam/lazy_adam_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// PrefetchRow, LazyAdamConsts, UpdateLanes, LanesFinite, ForEachSpan (shared with
// EmbeddingBagLazyAdam).
#include "common/lazy_adam_rows_hwy-inl.h"

int64_t LazyAdamRows(const LazyAdamRowsArgs &a, int64_t begin, int64_t end, float *scratch) {
  const int64_t D = a.dim;
  const LazyAdamConsts c{a.beta1,           a.beta2,   a.one_minus_beta1,
                         a.one_minus_beta2, a.epsilon, a.neg_lr};
  const int64_t ahead = a.prefetch_ahead;
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    // Only the rows of a table row that exists: a padding entry's row is R, one past the table,
    // and R * stride lies outside the tables (a one-row table may have any row stride, even
    // 2^62 - 1, since it never steps by it: forming m + 1 * stride would wrap around the address
    // space, undefined behaviour even unread). For r < R, r * stride is within the table, whose
    // extent the plan checked (lazy_adam_plan.cc).
    if (k + ahead < end && (a.entries[k + ahead] >> 32) < a.row_limit) {
      const uint64_t e = a.entries[k + ahead];
      const auto r = static_cast<int64_t>(e >> 32);
      PrefetchRow(a.grad + static_cast<int64_t>(e & 0xffffffffu) * a.grad_stride, D);
      PrefetchRow(a.m + r * a.m_stride, D);
      PrefetchRow(a.v + r * a.v_stride, D);
      PrefetchRow(a.var + r * a.var_stride, D);
    }
    const uint64_t row = a.entries[k] >> 32;
    const float *g = a.grad + static_cast<int64_t>(a.entries[k] & 0xffffffffu) * a.grad_stride;
    int64_t next = k + 1;
    if (next < end && (a.entries[next] >> 32) == row) {
      // Duplicates: sum the occurrences in order into scratch.
      for (int64_t j = 0; j < D; ++j) scratch[j] = g[j];
      for (; next < end && (a.entries[next] >> 32) == row; ++next) {
        const float *h =
            a.grad + static_cast<int64_t>(a.entries[next] & 0xffffffffu) * a.grad_stride;
        ForEachSpan(D, [&](auto d, int64_t j) {
          hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), hn::LoadU(d, h + j)), d, scratch + j);
        });
      }
      g = scratch;
    }
    k = next;
    if (row >= a.row_limit) continue;  // padding

    bool finite = true;
    ForEachSpan(D, [&](auto d, int64_t j) { finite = LanesFinite(d, g + j) && finite; });
    if (!finite) {
      ++skipped;
      continue;
    }
    const auto r = static_cast<int64_t>(row);
    float *m = a.m + r * a.m_stride;
    float *v = a.v + r * a.v_stride;
    float *var = a.var + r * a.var_stride;
    ForEachSpan(D, [&](auto d, int64_t j) { UpdateLanes(d, c, g + j, m + j, v + j, var + j); });
  }
  return skipped;
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(LazyAdamRows);

// Looked up on each call (one table read) so that tests can switch targets.
LazyAdamRowsFn lazy_adam_rows_optimized() {
  return FUSEKIT_HWY_DISPATCH(LazyAdamRows);
}

}  // namespace fusekit
#endif  // HWY_ONCE
