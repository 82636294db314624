// fusekit internal, per Highway target: the FP8 state format's codes on vectors
// (docs/fp8_state.md), the operations of common/fp8_codes.h lane by lane (bitwise the same
// results): decoding is a shift, an add and a select (an int-to-float conversion for the codes
// below the first normal, so that no subnormal float is ever an operand); encoding rounds the
// float32 bits to the format's mantissa width (a float32 addition of a power of two below the first
// normal). No table, no gather, no permute.
//
// Fp8Decode (the kernels' decode: codes from memory, times the block's scale) takes a shorter
// road on targets with F16C: a code's bits placed in a float16 are the code's value / 256 exactly
// (both formats have float16's exponent layout with bias 7 instead of 15, and float16's
// subnormals are theirs), the hardware conversion widens it, and * 256 is exact.
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
  // ((b + 2^(S-1) - 1 + lsb) >> S) - (120 << M), the rebias folded into the addend (an arithmetic
  // shift of X - 120 * 2^23 is X's shift minus 120 << M exactly); lanes below 2^-6 are not used.
  const auto rounded = hn::Add(hn::Add(b, hn::Set(di, (1 << (S - 1)) - 1 - (120 << 23))),
                               hn::And(hn::ShiftRight<S>(b), hn::Set(di, 1)));
  const auto normal = hn::ShiftRight<S>(rounded);
  auto code = hn::IfThenElse(hn::RebindMask(di, hn::Lt(a, hn::Set(df, 0x1p-6f))), sub, normal);
  code = hn::Min(code, hn::Set(di, static_cast<int32_t>(F.max_code)));
  if constexpr (F.is_signed)
    code = hn::Or(code, hn::And(hn::ShiftRight<24>(bits), hn::Set(di, 0x80)));
  return code;
}

// value(code) * scale for the N codes at p (N = Lanes(df)), as Mul(Fp8Value<F>(the codes), scale)
// bit for bit (E4M3's NaN codes give NaN: not the same NaN bits, which no result depends on: a NaN
// m makes its block or row non-finite, and the guard refuses it). On F16C targets through float16
// (above): E4M3 code s.eeee.fff -> float16 bits s.0eeee.fff0000000, UE4M4 eeee.ffff ->
// 0eeee.ffff000000; the value of those bits is the code's value / 256, subnormals included; then
// * 256 (exact) and * scale, the reference's one rounding.
template <const Fp8Format &F, class DF>
HWY_INLINE hn::Vec<DF> Fp8Decode(DF df, const uint8_t *p, hn::Vec<DF> scale) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto w = hn::PromoteTo(d16, hn::LoadU(d8, p));
  hn::Vec<decltype(d16)> h;
  if constexpr (F.is_signed) {
    // (w << 8) >> 1, arithmetic: the sign to bit 15 (and 14, cleared), the magnitude to 7..13.
    h = hn::And(hn::BitCast(d16, hn::ShiftRight<1>(hn::BitCast(di16, hn::ShiftLeft<8>(w)))),
                hn::Set(d16, uint16_t{0xbfff}));
    const auto nan = hn::Eq(hn::Or(w, hn::Set(d16, uint16_t{0x80})), hn::Set(d16, uint16_t{0xff}));
    h = hn::IfThenElse(nan, hn::Set(d16, uint16_t{0x7e00}), h);  // float16's quiet NaN
  } else {
    h = hn::ShiftLeft<6>(w);
  }
  const auto x = hn::PromoteTo(df, hn::BitCast(dh, h));
  return hn::Mul(hn::Mul(x, hn::Set(df, 256.0f)), scale);
#else
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  return hn::Mul(Fp8Value<F>(df, di, hn::PromoteTo(di, hn::LoadU(d8, p))), scale);
#endif
}

// Stores codes (int32 lanes, 0..255, as Fp8Code makes them) as bytes at p: a truncation, which
// equals the saturating DemoteTo for such lanes and takes fewer instructions.
template <class D8, class DI>
HWY_INLINE void StoreFp8Codes(D8 d8, DI di, hn::Vec<DI> code, uint8_t *p) {
  const hn::RebindToUnsigned<DI> du;
  (void)di;
  hn::StoreU(hn::TruncateTo(d8, hn::BitCast(du, code)), d8, p);
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_ toggle
