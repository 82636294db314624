// AdamW, the cpu_hwy implementation's kernel: Highway SIMD over the elements, compiled for every
// x86 target Highway builds and dispatched at run time. The same float32 operations in the same
// order as the reference kernel (common/hwy_dtype-inl.h's AdamVectors; no FMA), so results are
// bitwise equal. Each vector's new m, v and var are computed in registers and checked before
// anything is stored; a vector where one of them would be NaN or Inf (as stored) is redone element
// by element by the reference kernel, which leaves those elements unchanged (common/adam_update.h);
// the reference kernel also does the tail of fewer elements than a vector.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "adam_w/adam_w_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <bit>
#include <limits>

#include "adam_w/adam_w_kernels.h"
#include "common/float_types.h"
#include "common/hwy_dispatch.h"
#include "common/hwy_dtype-inl.h"
#include "fusekit/float16.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {  // internal linkage: no clash with other operators' kernels of the same names

template <typename T>
int64_t Elements(const AdamWArgs &a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  float *const m_state = a.m, *const v_state = a.v;  // locals: stores cannot be taken for `a`
  const AdamVectors<decltype(df)> adam(df, a);
  // |x| < limit is false for NaN, for Inf and, for var, for what its dtype would store as Inf.
  const auto inf = hn::Set(df, std::numeric_limits<float>::infinity());
  const auto var_limit = hn::Set(df, std::bit_cast<float>(adam_stored_finite_limit<T>()));
  int64_t skipped = 0;
  int64_t i = begin;
  for (; i + N <= end; i += N) {
    auto m = hn::LoadU(df, m_state + i), v = hn::LoadU(df, v_state + i);
    const auto w = adam.Update(LoadWide(df, grad + i), m, v, LoadWide(df, var + i));
    const auto ok = hn::And(hn::And(hn::Lt(hn::Abs(m), inf), hn::Lt(hn::Abs(v), inf)),
                            hn::Lt(hn::Abs(w), var_limit));
    if (!hn::AllTrue(df, ok)) {
      skipped += adam_w_elements_reference(a, i, i + N);  // element by element
      continue;
    }
    StoreNarrow(df, w, var + i);
    hn::StoreU(m, df, m_state + i);
    hn::StoreU(v, df, v_state + i);
  }
  return skipped + adam_w_elements_reference(a, i, end);
}

int64_t AdamWElements(const AdamWArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype, [&]<class T>() { return Elements<T>(a, begin, end); });
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(AdamWElements);

AdamWElementsFn adam_w_elements_hwy() {
  return FUSEKIT_HWY_DISPATCH(AdamWElements);
}

}  // namespace fusekit
#endif  // HWY_ONCE
