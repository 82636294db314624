// EmbeddingBagLazyAdam, the optimized kernel: Highway SIMD over the row, compiled for every x86
// target Highway builds and dispatched at run time. Per row, the scaled grad_output rows of its
// lookups are summed into a scratch row (or, for a row looked up once in an unweighted sum table,
// read where they are), then LazyAdam's vector step (common/lazy_adam_rows_hwy-inl.h). Prefetches
// the grad_output, m, v and var rows of the entry a few steps ahead. Same float32 operations in the
// same order as the reference kernel (no FMA: bitwise equal results).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "embedding_bag_lazy_adam/embedding_bag_lazy_adam_hwy.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "common/embedding_bags.h"
#include "common/hwy_dispatch.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// PrefetchRow, LazyAdamConsts, UpdateLanes, LanesFinite, ForEachSpan (LazyAdam's); BagRowGradient.
#include "common/lazy_adam_rows_hwy-inl.h"
// (after ForEachSpan)
#include "common/bag_gradient_hwy-inl.h"

int64_t EmbeddingBagLazyAdamRows(const EmbeddingBagLazyAdamRowsArgs &a, int64_t begin, int64_t end,
                                 float *scratch) {
  const int64_t D = a.dim;
  const LazyAdamConsts c{a.beta1,           a.beta2,   a.one_minus_beta1,
                         a.one_minus_beta2, a.epsilon, a.neg_lr};
  const int64_t ahead = a.prefetch_ahead;
  const BagGradientArgs &bags = a.bags;
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    if (k + ahead < end) {
      const uint64_t e = a.entries[k + ahead];
      const auto r = static_cast<int64_t>(e >> 32);
      PrefetchRow(bags.grad_output + static_cast<int64_t>(bags.bag(e)) * bags.grad_stride, D);
      PrefetchRow(a.m + r * a.m_stride, D);
      PrefetchRow(a.v + r * a.v_stride, D);
      PrefetchRow(a.var + r * a.var_stride, D);
    }
    const uint64_t row = a.entries[k] >> 32;
    const float *g;
    k = BagRowGradient(bags, a.entries, k, end, D, scratch, /*in_place=*/true, &g);

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
HWY_EXPORT(EmbeddingBagLazyAdamRows);

// Looked up on each call (one table read) so that tests can switch targets.
EmbeddingBagLazyAdamRowsFn embedding_bag_lazy_adam_rows_optimized() {
  return FUSEKIT_HWY_DISPATCH(EmbeddingBagLazyAdamRows);
}

}  // namespace fusekit
#endif  // HWY_ONCE
