// LazyAdam, the optimized kernel: Highway SIMD over the row, compiled for every x86 target Highway
// builds and dispatched at run time; prefetches the rows of the entries a few steps ahead. Same
// float32 operations in the same order as the reference kernel (no FMA: bitwise equal results).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lazy_adam/lazy_adam_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <cmath>

#include "lazy_adam/lazy_adam_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How many entries ahead the kernel prefetches (FBGEMM's sparse optimizers use 16 rows).
constexpr int64_t kPrefetchAhead = 12;

HWY_INLINE void PrefetchRow(const float *p, int64_t dim) {
  const auto *bytes = reinterpret_cast<const char *>(p);
  const int64_t n = dim * static_cast<int64_t>(sizeof(float));
  for (int64_t off = 0; off < n; off += 64) hwy::Prefetch(bytes + off);
  hwy::Prefetch(bytes + n - 1);
}

int64_t LazyAdamRows(const LazyAdamRowsArgs &a, int64_t begin, int64_t end, float *scratch) {
  const hn::ScalableTag<float> d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t D = a.dim;
  const auto vb1 = hn::Set(d, a.beta1), vb2 = hn::Set(d, a.beta2);
  const auto vomb1 = hn::Set(d, a.one_minus_beta1), vomb2 = hn::Set(d, a.one_minus_beta2);
  const auto veps = hn::Set(d, a.epsilon), vneglr = hn::Set(d, a.neg_lr);
  const auto zero = hn::Zero(d);

  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    if (k + kPrefetchAhead < end) {
      const uint64_t e = a.entries[k + kPrefetchAhead];
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
        const float *h = a.grad + static_cast<int64_t>(a.entries[next] & 0xffffffffu) * a.grad_stride;
        int64_t j = 0;
        for (; j + N <= D; j += N) {
          hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), hn::LoadU(d, h + j)), d, scratch + j);
        }
        for (; j < D; ++j) scratch[j] = scratch[j] + h[j];
      }
      g = scratch;
    }
    k = next;
    if (row >= a.row_limit) continue;  // padding

    // Finite check: g * 0 is 0 for finite g and NaN for Inf or NaN.
    auto acc = zero;
    int64_t j = 0;
    for (; j + N <= D; j += N) acc = hn::Add(acc, hn::Mul(hn::LoadU(d, g + j), zero));
    bool finite = hn::AllTrue(d, hn::Eq(acc, zero));
    for (; j < D; ++j) finite = finite && std::isfinite(g[j]);
    if (!finite) {
      ++skipped;
      continue;
    }

    const auto r = static_cast<int64_t>(row);
    float *HWY_RESTRICT m = a.m + r * a.m_stride;
    float *HWY_RESTRICT v = a.v + r * a.v_stride;
    float *HWY_RESTRICT var = a.var + r * a.var_stride;
    j = 0;
    for (; j + N <= D; j += N) {
      const auto gj = hn::LoadU(d, g + j);
      const auto mj = hn::Add(hn::Mul(hn::LoadU(d, m + j), vb1), hn::Mul(gj, vomb1));
      const auto vj = hn::Abs(hn::Add(hn::Mul(hn::LoadU(d, v + j), vb2), hn::Mul(hn::Mul(gj, gj), vomb2)));
      const auto denom = hn::Add(hn::Sqrt(vj), veps);
      hn::StoreU(mj, d, m + j);
      hn::StoreU(vj, d, v + j);
      hn::StoreU(hn::Add(hn::LoadU(d, var + j), hn::Div(hn::Mul(mj, vneglr), denom)), d, var + j);
    }
    for (; j < D; ++j) {
      const float gj = g[j];
      const float mj = m[j] * a.beta1 + gj * a.one_minus_beta1;
      const float vj = std::fabs(v[j] * a.beta2 + (gj * gj) * a.one_minus_beta2);
      const float denom = std::sqrt(vj) + a.epsilon;
      m[j] = mj;
      v[j] = vj;
      var[j] = var[j] + (mj * a.neg_lr) / denom;
    }
  }
  return skipped;
}

const char *LazyAdamTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(LazyAdamRows);
HWY_EXPORT(LazyAdamTargetName);

// Looked up on each call (one table read) so that tests can switch targets.
LazyAdamRowsFn lazy_adam_rows_optimized() {
  if (!hwy::GetChosenTarget().IsInitialized()) hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return HWY_DYNAMIC_DISPATCH(LazyAdamRows);
}
const char *lazy_adam_optimized_target() {
  if (!hwy::GetChosenTarget().IsInitialized()) hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return HWY_DYNAMIC_DISPATCH(LazyAdamTargetName)();
}

}  // namespace fusekit
#endif  // HWY_ONCE
