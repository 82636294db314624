// The embedding-bag optimizers' row gradient (common/embedding_bags.h) as a function, Highway SIMD,
// compiled for every x86 target Highway builds and dispatched at run time: for a kernel that takes
// the gradient into a buffer of its own (EmbeddingBagLazyAdamQuant's tiles of rows).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/bag_gradient_hwy.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/embedding_bags.h"
#include "common/hwy_dispatch.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#include "common/lazy_adam_rows_hwy-inl.h"
// (after ForEachSpan)
#include "common/bag_gradient_hwy-inl.h"

int64_t BagRowGradientInto(const BagGradientArgs &a, const uint64_t *entries, int64_t k,
                           int64_t end, int64_t dim, float *g) {
  const float *unused;
  return BagRowGradient(a, entries, k, end, dim, g, /*in_place=*/false, &unused);
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(BagRowGradientInto);

BagRowGradientFn bag_row_gradient_hwy() {
  return FUSEKIT_HWY_DISPATCH(BagRowGradientInto);
}

}  // namespace fusekit
#endif  // HWY_ONCE
