// fusekit tests: run a check once per SIMD target that Highway compiled and this CPU supports, so
// every dispatched kernel (not only the best one) meets the reference.
#ifndef FUSEKIT_TESTS_COMMON_SIMD_TARGETS_H_
#define FUSEKIT_TESTS_COMMON_SIMD_TARGETS_H_

#include <gtest/gtest.h>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "common/plan.h"  // hwy_dispatched_target

namespace fusekit::testing {

template <typename Fn>
void for_each_simd_target(Fn &&fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    fn(hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_SIMD_TARGETS_H_
