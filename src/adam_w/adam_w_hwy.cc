// AdamW, the cpu_hwy implementation's kernel: Highway SIMD over the elements, compiled for every
// x86 target Highway builds and dispatched at run time. The same float32 operations in the same
// order as the reference kernel (common/hwy_dtype-inl.h's AdamVectors; no FMA), so results are
// bitwise equal; a vector with a non-finite gradient lane is done element by element.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "adam_w/adam_w_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "adam_w/adam_w_kernels.h"
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
  const auto zero = hn::Zero(df);
  const AdamVectors<decltype(df)> adam(df, a);
  int64_t skipped = 0;
  auto scalar = [&](int64_t i) {
    const float gr = to_float(grad[i]);
    if (!std::isfinite(gr)) {
      ++skipped;
      return;
    }
    var[i] = from_float<T>(adam_update(a, gr, &a.m[i], &a.v[i], to_float(var[i])));
  };
  int64_t i = begin;
  for (; i + N <= end; i += N) {
    const auto gr = LoadWide(df, grad + i);
    if (!hn::AllTrue(df, hn::Eq(hn::Mul(gr, zero), zero))) {
      for (int64_t k = i; k < i + N; ++k) scalar(k);
      continue;
    }
    auto m = hn::LoadU(df, a.m + i), v = hn::LoadU(df, a.v + i);
    StoreNarrow(df, adam.Update(gr, m, v, LoadWide(df, var + i)), var + i);
    hn::StoreU(m, df, a.m + i);
    hn::StoreU(v, df, a.v + i);
  }
  for (; i < end; ++i) scalar(i);
  return skipped;
}

int64_t AdamWElements(const AdamWArgs &a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::kFloat16:
      return Elements<float16_t>(a, begin, end);
    case DType::kBFloat16:
      return Elements<bfloat16_t>(a, begin, end);
    default:
      return Elements<float>(a, begin, end);
  }
}

const char *TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(AdamWElements);
HWY_EXPORT(TargetName);

AdamWElementsFn adam_w_elements_hwy() {
  return FUSEKIT_HWY_DISPATCH(AdamWElements);
}
const char *adam_w_hwy_target() {
  return FUSEKIT_HWY_DISPATCH(TargetName)();
}

}  // namespace fusekit
#endif  // HWY_ONCE
