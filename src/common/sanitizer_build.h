// fusekit internal: included first in every source of a sanitizer build (ASan + UBSan, TSan; the
// top-level CMakeLists.txt passes it with -include). It lets the compiler choose what to inline.
//
// Highway marks its operations and our kernels' helpers HWY_INLINE (always_inline under
// optimization) and HWY_API functions HWY_FLATTEN: every call is inlined, and every inlined copy
// is instrumented again. With the sanitizers that made compiling the kernels super-linear: clang
// 14 took ~10 minutes on lazy_adam_quant_avx512vbmi.cc at -O2 (33 s when it chooses what to
// inline; 47 s without sanitizers), GCC 12 186 s on lazy_adam_quant_hwy.cc (60 s). Inlining does
// not change results (no FP contraction anywhere: -ffp-contract=off), so the sanitizer builds
// still test the same arithmetic; the Release builds keep the forced inlining.
#ifndef FUSEKIT_COMMON_SANITIZER_BUILD_H_
#define FUSEKIT_COMMON_SANITIZER_BUILD_H_

#include <hwy/base.h>  // defines HWY_INLINE and HWY_FLATTEN once (include guard): redefined here

#undef HWY_INLINE
#define HWY_INLINE inline
#undef HWY_FLATTEN
#define HWY_FLATTEN

#endif  // FUSEKIT_COMMON_SANITIZER_BUILD_H_
