// The Highway target every operator's cpu_hwy kernel runs on now: the one Highway chose for this
// CPU (or a test chose: tests/common/simd_targets.h), shared by all dispatch tables. For
// FUSEKIT_VERBOSE's isa= field and the tests that switch targets.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/hwy_target.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/hwy_dispatch.h"
#include "common/plan.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace {
const char *TargetName() {
  return hwy::TargetName(HWY_TARGET);
}
}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(TargetName);

const char *hwy_dispatched_target() {
  return FUSEKIT_HWY_DISPATCH(TargetName)();
}
}  // namespace fusekit
#endif  // HWY_ONCE
