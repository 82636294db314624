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

#include "common/hwy_dispatch.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// PrefetchRow, LazyAdamConsts, UpdateLanes, LanesFinite, ForEachSpan (LazyAdam's).
#include "common/lazy_adam_rows_hwy-inl.h"

int64_t EmbeddingBagLazyAdamRows(const EmbeddingBagLazyAdamRowsArgs &a, int64_t begin, int64_t end,
                                 float *scratch) {
  const int64_t D = a.dim;
  const LazyAdamConsts c{a.beta1,           a.beta2,   a.one_minus_beta1,
                         a.one_minus_beta2, a.epsilon, a.neg_lr};
  const bool scaled = a.bag_scale != nullptr || a.weights != nullptr;
  const int64_t ahead = a.prefetch_ahead;
  // The grad_output row of lookup i and its coefficient c_i = s_b * w_i.
  const auto source = [&](uint64_t entry, float *coef) {
    const auto i = static_cast<int64_t>(entry & 0xffffffffu);
    const auto b = a.bag_of != nullptr ? a.bag_of[i] : static_cast<uint32_t>(i);
    const float s = a.bag_scale != nullptr ? a.bag_scale[b] : 1.0f;
    *coef = a.weights != nullptr ? s * a.weights[i * a.weight_stride] : s;
    return a.grad_output + static_cast<int64_t>(b) * a.grad_stride;
  };
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    if (k + ahead < end) {
      const uint64_t e = a.entries[k + ahead];
      const auto r = static_cast<int64_t>(e >> 32);
      const uint32_t low = e & 0xffffffffu;
      PrefetchRow(a.grad_output + static_cast<int64_t>(a.bag_of != nullptr ? a.bag_of[low] : low) *
                                      a.grad_stride,
                  D);
      PrefetchRow(a.m + r * a.m_stride, D);
      PrefetchRow(a.v + r * a.v_stride, D);
      PrefetchRow(a.var + r * a.var_stride, D);
    }
    const uint64_t row = a.entries[k] >> 32;
    float coef;
    const float *g = source(a.entries[k], &coef);
    int64_t next = k + 1;
    const bool repeated = next < end && (a.entries[next] >> 32) == row;
    if (scaled || repeated) {
      // x = grad_output[b] * c for the first lookup (the row itself when unscaled), then
      // g = g + x for each further lookup, in order.
      if (scaled) {
        ForEachSpan(D, [&](auto d, int64_t j) {
          hn::StoreU(hn::Mul(hn::LoadU(d, g + j), hn::Set(d, coef)), d, scratch + j);
        });
      } else {
        ForEachSpan(D, [&](auto d, int64_t j) { hn::StoreU(hn::LoadU(d, g + j), d, scratch + j); });
      }
      for (; next < end && (a.entries[next] >> 32) == row; ++next) {
        const float *h = source(a.entries[next], &coef);
        if (scaled) {
          ForEachSpan(D, [&](auto d, int64_t j) {
            const auto x = hn::Mul(hn::LoadU(d, h + j), hn::Set(d, coef));
            hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), x), d, scratch + j);
          });
        } else {
          ForEachSpan(D, [&](auto d, int64_t j) {
            hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), hn::LoadU(d, h + j)), d, scratch + j);
          });
        }
      }
      g = scratch;
    }
    k = next;

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
