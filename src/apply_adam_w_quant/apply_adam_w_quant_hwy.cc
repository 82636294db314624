// ApplyAdamWQuant, the cpu_hwy implementation's kernel: Highway SIMD within a block of 256
// elements (apply_adam_w_quant_hwy-inl.h), compiled for every x86 target Highway builds (generic
// AVX-512 included) and dispatched at run time. On CPUs with AVX-512 VBMI the implementation list
// puts cpu_avx512vbmi (apply_adam_w_quant_avx512vbmi.cc) first; this kernel still runs there when
// asked for by name (the tests run it on every target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "apply_adam_w_quant/apply_adam_w_quant_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "apply_adam_w_quant/apply_adam_w_quant_hwy-inl.h"
#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/float_types.h"
#include "common/hwy_dispatch.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace {

int64_t AdamWQuantBlocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype, [&]<class T>() { return QuantBlocks<T>(a, begin, end); });
}

template <const Fp8Format &FV>
int64_t AdamWQuantFp8BlocksOf(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype, [&]<class T>() {
    if (a.gnorm_scale == 1.0f) {
      return a.decay_after ? Fp8Blocks<T, FV, true, true>(a, begin, end)
                           : Fp8Blocks<T, FV, true, false>(a, begin, end);
    }
    return a.decay_after ? Fp8Blocks<T, FV, false, true>(a, begin, end)
                         : Fp8Blocks<T, FV, false, false>(a, begin, end);
  });
}

// sqrt(v) as UE4M4 (state format fp8) and as UE3M5 (fp8_ue3m5).
int64_t AdamWQuantFp8Blocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return AdamWQuantFp8BlocksOf<kUE4M4>(a, begin, end);
}
int64_t AdamWQuantFp8Ue3m5Blocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return AdamWQuantFp8BlocksOf<kUE3M5>(a, begin, end);
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(AdamWQuantBlocks);
HWY_EXPORT(AdamWQuantFp8Blocks);
HWY_EXPORT(AdamWQuantFp8Ue3m5Blocks);

// Looked up on each call (one table read) so that tests can switch targets.
AdamWQuantBlocksFn adam_w_quant_blocks_hwy() {
  return FUSEKIT_HWY_DISPATCH(AdamWQuantBlocks);
}

AdamWQuantBlocksFn adam_w_quant_fp8_blocks_hwy(QuantStateFormat format) {
  return format == QuantStateFormat::kFp8Ue3m5 ? FUSEKIT_HWY_DISPATCH(AdamWQuantFp8Ue3m5Blocks)
                                               : FUSEKIT_HWY_DISPATCH(AdamWQuantFp8Blocks);
}

}  // namespace fusekit
#endif  // HWY_ONCE
