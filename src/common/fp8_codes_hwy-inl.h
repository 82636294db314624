// fusekit internal, per Highway target: the FP8 state format's codes on vectors
// (docs/fp8_state.md), the operations of common/fp8_codes.h lane by lane (bitwise the same
// results): decoding is a shift, an add and a select (an int-to-float conversion for the codes
// below the first normal, so that no subnormal float is ever an operand); encoding rounds the
// float32 bits to the format's mantissa width (a float32 addition of a power of two below the first
// normal). No table, no gather, no permute.
//
// Include it after <hwy/highway.h> in a file compiled with foreach_target.h, outside any namespace.

#include <bit>
#include <cstdint>
#include <limits>

#include "common/fp8_codes.h"

#if defined(FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_
#undef FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_
#else
#define FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The values of codes (int32 lanes holding 0..255), as fp8_value<F>.
template <const Fp8Format &F, class DF, class DI>
HWY_INLINE hn::Vec<DF> Fp8Value(DF df, DI di, hn::Vec<DI> code) {
  constexpr int M = F.mantissa_bits;
  const auto mag = F.is_signed ? hn::And(code, hn::Set(di, 0x7f)) : code;
  const auto sub = hn::Mul(hn::ConvertTo(df, mag), hn::Set(df, M == 3 ? 0x1p-9f : 0x1p-10f));
  const auto normal =
      hn::BitCast(df, hn::Add(hn::ShiftLeft<23 - M>(mag), hn::Set(di, int32_t{120} << 23)));
  auto x = hn::IfThenElse(hn::RebindMask(df, hn::Lt(mag, hn::Set(di, 1 << M))), sub, normal);
  if constexpr (F.is_signed) {
    x = hn::Or(x, hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, hn::Set(di, 0x80)))));
    x = hn::IfThenElse(hn::RebindMask(df, hn::Eq(mag, hn::Set(di, 0x7f))),
                       hn::Set(df, std::numeric_limits<float>::quiet_NaN()), x);
  }
  return x;
}

// The codes (int32 lanes, 0..255) of finite float32 values, as fp8_code<F>.
template <const Fp8Format &F, class DF, class DI>
HWY_INLINE hn::Vec<DI> Fp8Code(DF df, DI di, hn::Vec<DF> x) {
  constexpr int M = F.mantissa_bits, S = 23 - M;
  constexpr float kMagic = M == 3 ? 0x1p14f : 0x1p13f;
  const auto bits = hn::BitCast(di, x);
  const auto b = hn::And(bits, hn::Set(di, 0x7fffffff));
  const auto a = hn::BitCast(df, b);
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(a, hn::Set(df, kMagic))),
                           hn::Set(di, std::bit_cast<int32_t>(kMagic)));
  const auto rounded = hn::Add(hn::Add(b, hn::Set(di, (1 << (S - 1)) - 1)),
                               hn::And(hn::ShiftRight<S>(b), hn::Set(di, 1)));
  const auto normal = hn::Sub(hn::ShiftRight<S>(rounded), hn::Set(di, 120 << M));
  auto code = hn::IfThenElse(hn::RebindMask(di, hn::Lt(a, hn::Set(df, 0x1p-6f))), sub, normal);
  code = hn::Min(code, hn::Set(di, static_cast<int32_t>(F.max_code)));
  if constexpr (F.is_signed)
    code = hn::Or(code, hn::And(hn::ShiftRight<24>(bits), hn::Set(di, 0x80)));
  return code;
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_ toggle
