// fusekit internal: FUSEKIT_INLINE, the forced inlining of a hand-written kernel's helpers.
//
// It is HWY_INLINE (always_inline under optimization), except in sanitizer builds (ASan, TSan),
// where the compiler chooses what to inline: the sanitizers instrument each forced copy, and
// clang 14 then took ~10 minutes on lazy_adam_quant_avx512vbmi.cc at -O2 (33 s when it chooses;
// 47 s without sanitizers). Results do not change with inlining (no FP contraction anywhere:
// -ffp-contract=off), so the sanitizer builds still test the same arithmetic.
#ifndef FUSEKIT_COMMON_KERNEL_INLINE_H_
#define FUSEKIT_COMMON_KERNEL_INLINE_H_

#include <hwy/base.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FUSEKIT_SANITIZER_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FUSEKIT_SANITIZER_BUILD 1
#endif
#endif

#if defined(FUSEKIT_SANITIZER_BUILD)
#define FUSEKIT_INLINE inline
#else
#define FUSEKIT_INLINE HWY_INLINE
#endif

#endif  // FUSEKIT_COMMON_KERNEL_INLINE_H_
