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

HWY_INLINE void PrefetchRow(const float *p, int64_t dim) {
  const auto *bytes = reinterpret_cast<const char *>(p);
  const int64_t n = dim * static_cast<int64_t>(sizeof(float));
  for (int64_t off = 0; off < n; off += 64) hwy::Prefetch(bytes + off);
  hwy::Prefetch(bytes + n - 1);
}

struct Consts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, epsilon, neg_lr;
};

// The update of lanes [j, j + Lanes(d)) of one row. Every op is an exact IEEE operation, in the
// order of the scalar formula, so any vector width gives the scalar result bit for bit.
template <class D>
HWY_INLINE void UpdateLanes(D d, const Consts &c, const float *HWY_RESTRICT g,
                            float *HWY_RESTRICT m, float *HWY_RESTRICT v, float *HWY_RESTRICT var) {
  const auto gj = hn::LoadU(d, g);
  const auto mj = hn::Add(hn::Mul(hn::LoadU(d, m), hn::Set(d, c.beta1)),
                          hn::Mul(gj, hn::Set(d, c.one_minus_beta1)));
  const auto vj = hn::Abs(hn::Add(hn::Mul(hn::LoadU(d, v), hn::Set(d, c.beta2)),
                                  hn::Mul(hn::Mul(gj, gj), hn::Set(d, c.one_minus_beta2))));
  const auto denom = hn::Add(hn::Sqrt(vj), hn::Set(d, c.epsilon));
  hn::StoreU(mj, d, m);
  hn::StoreU(vj, d, v);
  hn::StoreU(hn::Add(hn::LoadU(d, var), hn::Div(hn::Mul(mj, hn::Set(d, c.neg_lr)), denom)), d, var);
}

// Nonzero (NaN) when any of the lanes is NaN or Inf: g * 0 is 0 for finite g.
template <class D>
HWY_INLINE bool LanesFinite(D d, const float *HWY_RESTRICT g) {
  const auto z = hn::Zero(d);
  return hn::AllTrue(d, hn::Eq(hn::Mul(hn::LoadU(d, g), z), z));
}

// Applies fn(tag, j) over [0, D): full vectors, then one vector each of 8 and 4 lanes where the
// full vector is wider, then single lanes. A row of 8 floats is one 8-lane step even on AVX-512.
template <class Fn>
HWY_INLINE void ForEachSpan(int64_t D, Fn &&fn) {
  const hn::ScalableTag<float> d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= D; j += N) fn(d, j);
#if HWY_TARGET != HWY_SCALAR
  if (N > 8 && j + 8 <= D) {
    fn(hn::CappedTag<float, 8>(), j);
    j += 8;
  }
  if (N > 4 && j + 4 <= D) {
    fn(hn::CappedTag<float, 4>(), j);
    j += 4;
  }
#endif
  for (; j < D; ++j) fn(hn::CappedTag<float, 1>(), j);
}

int64_t LazyAdamRows(const LazyAdamRowsArgs &a, int64_t begin, int64_t end, float *scratch) {
  const int64_t D = a.dim;
  const Consts c{a.beta1, a.beta2, a.one_minus_beta1, a.one_minus_beta2, a.epsilon, a.neg_lr};
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
