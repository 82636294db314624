// fusekit internal: run-time dispatch of Highway kernels. Every operator's `<op>_hwy.cc` exports
// its per-target functions with HWY_EXPORT and calls them through FUSEKIT_HWY_DISPATCH(name),
// which makes sure Highway has chosen the best target of this CPU first. The table is looked up on
// each call (one load), so that tests can switch targets (tests/common/simd_targets.h).
#ifndef FUSEKIT_COMMON_HWY_DISPATCH_H_
#define FUSEKIT_COMMON_HWY_DISPATCH_H_

#include <hwy/highway.h>
#include <hwy/targets.h>

namespace fusekit {

inline void ensure_hwy_target_chosen() {
  if (!hwy::GetChosenTarget().IsInitialized())
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace fusekit

#define FUSEKIT_HWY_DISPATCH(name) \
  (::fusekit::ensure_hwy_target_chosen(), HWY_DYNAMIC_DISPATCH(name))

#endif  // FUSEKIT_COMMON_HWY_DISPATCH_H_
