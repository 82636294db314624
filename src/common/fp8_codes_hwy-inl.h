// fusekit internal, per Highway target: the FP8 state formats' codes on vectors
// (docs/fp8_state.md), the operations of common/fp8_codes.h lane by lane (bitwise the same
// results): decoding is a shift, an add and a select (an int-to-float conversion for the codes
// below the first normal, so that no subnormal float is ever an operand); encoding rounds the
// float32 bits to the format's mantissa width (a float32 addition of a power of two below the first
// normal). No table, no gather, no permute. Fp8CodeInBlock, the coding of ApplyAdamWQuant's kernel,
// reaches the same codes by one float32 addition for both ranges, where the value is known to lie
// within its block's range (no saturation).
//
// Fp8Decode (the kernels' decode: codes from memory, times the block's scale) takes a shorter
// road on targets with F16C: a code's bits placed in a float16 are the code's value / K exactly
// (every format has float16's exponent layout with its own bias instead of 15, and float16's
// subnormals are its; K = 2^(15 - bias): 256 for E4M3 and UE4M4, 4096 for UE3M5), the hardware
// conversion widens it, and the K goes into the scale.
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
  const auto sub = hn::Mul(hn::ConvertTo(df, mag), hn::Set(df, F.subnormal_unit()));
  const auto normal = hn::BitCast(
      df, hn::Add(hn::ShiftLeft<23 - M>(mag), hn::Set(di, static_cast<int32_t>(F.rebias() << 23))));
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
  constexpr float kMagic = F.subnormal_magic();
  constexpr auto kRebias = static_cast<int32_t>(F.rebias());
  const auto bits = hn::BitCast(di, x);
  const auto b = hn::And(bits, hn::Set(di, 0x7fffffff));
  const auto a = hn::BitCast(df, b);
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(a, hn::Set(df, kMagic))),
                           hn::Set(di, std::bit_cast<int32_t>(kMagic)));
  // ((b + 2^(S-1) - 1 + lsb) >> S) - (R << M), R = 127 - bias, the rebias folded into the addend
  // (an arithmetic shift of X - R * 2^23 is X's shift minus R << M exactly); lanes below the first
  // normal are not used.
  const auto rounded = hn::Add(hn::Add(b, hn::Set(di, (1 << (S - 1)) - 1 - (kRebias << 23))),
                               hn::And(hn::ShiftRight<S>(b), hn::Set(di, 1)));
  const auto normal = hn::ShiftRight<S>(rounded);
  auto code =
      hn::IfThenElse(hn::RebindMask(di, hn::Lt(a, hn::Set(df, F.min_normal()))), sub, normal);
  code = hn::Min(code, hn::Set(di, static_cast<int32_t>(F.max_code)));
  if constexpr (F.is_signed)
    code = hn::Or(code, hn::And(hn::ShiftRight<24>(bits), hn::Set(di, 0x80)));
  return code;
}

// (binade & mask) | c, the same as OrAnd(c, binade, mask); on AVX-512 one VPTERNLOGD that
// overwrites binade (a temporary) rather than a copy of the constant c.
template <class V>
HWY_INLINE V MaskedOr(V binade, V mask, V c) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(hn::DFromV<V>()) == 16)
    return V{_mm512_ternarylogic_epi32(binade.raw, mask.raw, c.raw, 0xea)};  // (A & B) | C
#endif
  return hn::OrAnd(c, binade, mask);
}

// The code of x = value * inv in a block coded with that inv (fp8_block_code: |value| at most the
// block's largest, so |x| at most the format's largest value rounded up by the two roundings of
// MAX / a and value * inv, 448, 496 or 31.5 times (1 + 2^-22), which rounds to the largest code:
// no saturation is needed), in the low byte of each int32 lane; the lane's other bytes are not the
// code's (StoreFp8Codes truncates). Bit for bit fp8_code<F>(x) there, by another road: the float32
// addition a + K, K a power of two 2^S (S = 23 - mantissa bits) times a's binade 2^e (clamped below
// at the first normal 2^(1 - bias)), rounds a to the format's grid, nearest-even, in the binade of
// K (a < 2^(M + 1) ulps of K: no carry out of it); the sum's bits then hold the rounded multiple k
// of K's ulp, and its exponent field e + S + 127, and (sum + (sum >> S)) mod 256 is
// k + (e + bias - 1) 2^M, the code: one form for the normal range and the one below it. K carries
// C0 = (bias - 128 - S) 2^M mod 256 in its mantissa (an even number of ulps: the rounding and its
// ties are the same) so that no constant is added after.
template <const Fp8Format &F, class DF, class DI>
HWY_INLINE hn::Vec<DI> Fp8CodeInBlock(DF df, DI di, hn::Vec<DF> x) {
  constexpr int M = F.mantissa_bits, S = 23 - M;
  // 152 (E4M3), 64 (UE4M4), 32 (UE3M5)
  constexpr int32_t kC0 = (((F.bias - 128 - S) * (1 << M)) % 256 + 256) % 256;
  static_assert(kC0 % 2 == 0);
  const auto bits = hn::BitCast(di, x);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (F.is_signed && hn::MaxLanes(DF()) == 16) {
    // x + K with K of x's sign (a sum of two values of one sign: the same rounding of |x|, the
    // sign kept): x's binade clamped below at 2^-6, its sign kept, in one VRANGEPS (the larger
    // magnitude of x and 2^-6, the sign of x); the sign goes to bit 7 from the sum's bit 31.
    const auto binade =
        hn::BitCast(di, hn::Vec<DF>{_mm512_range_ps(x.raw, _mm512_set1_ps(F.min_normal()), 0x03)});
    const auto k = hn::Add(MaskedOr(binade, hn::Set(di, int32_t(0xff800000u)), hn::Set(di, kC0)),
                           hn::Set(di, int32_t{S} << 23));
    const auto sum = hn::BitCast(di, hn::Add(x, hn::BitCast(df, k)));
    // (The arithmetic shift of a negative sum differs from the logical one above bit 11 only.)
    return hn::OrAnd(hn::Add(sum, hn::ShiftRight<S>(sum)), hn::ShiftRight<24>(sum),
                     hn::Set(di, 0x80));
  }
#endif
  // UE4M4 and UE3M5 code sqrt(v) * inv: never negative (v >= +0, so sqrt(v) is +0 or more).
  const auto b = F.is_signed ? hn::And(bits, hn::Set(di, 0x7fffffff)) : bits;
  const auto binade = hn::Max(b, hn::Set(di, static_cast<int32_t>(F.min_normal_bits())));
  const auto k = hn::Add(MaskedOr(binade, hn::Set(di, 0x7f800000), hn::Set(di, kC0)),
                         hn::Set(di, int32_t{S} << 23));
  const auto sum = hn::BitCast(di, hn::Add(hn::BitCast(df, b), hn::BitCast(df, k)));
  auto code = hn::Add(sum, hn::ShiftRight<S>(sum));
  if constexpr (F.is_signed) code = hn::OrAnd(code, hn::ShiftRight<24>(bits), hn::Set(di, 0x80));
  return code;
}

// Whether any of the n E4M3 codes at p is a NaN code (0x7f, 0xff).
HWY_INLINE bool Fp8HasNanCode(const uint8_t *p, int64_t n) {
  const hn::ScalableTag<uint8_t> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(d8));
  const auto high = hn::Set(d8, uint8_t{0x80});
  auto acc = hn::Zero(d8);
  int64_t j = 0;
  for (; j + N <= n; j += N) acc = hn::Max(acc, hn::Or(hn::LoadU(d8, p + j), high));
  bool nan = !hn::AllFalse(d8, hn::Eq(acc, hn::Set(d8, uint8_t{0xff})));
  for (; j < n; ++j) nan = nan || (p[j] & 0x7f) == 0x7f;
  return nan;
}

// Whether any of the n codes at p is 0.
HWY_INLINE bool Fp8HasZeroCode(const uint8_t *p, int64_t n) {
  const hn::ScalableTag<uint8_t> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(d8));
  auto acc = hn::Set(d8, uint8_t{0xff});
  int64_t j = 0;
  for (; j + N <= n; j += N) acc = hn::Min(acc, hn::LoadU(d8, p + j));
  bool zero = !hn::AllFalse(d8, hn::Eq(acc, hn::Zero(d8)));
  for (; j < n; ++j) zero = zero || p[j] == 0;
  return zero;
}

// The lost-v guard (docs/fp8_state.md) in the FP8 format, where v is s * s (never -0): v = m * m
// where v is 0. The same as "where v is 0 and m is not": for m = +-0, m * m is +0, which v is.
template <class V>
HWY_INLINE V GuardLostVOfSquare(V m, V v) {
  return hn::IfThenElse(hn::Eq(v, hn::Zero(hn::DFromV<V>())), hn::Mul(m, m), v);
}

// v = s * s with the lost-v guard, where v is 0 exactly where the code of s at p is 0 (the caller
// knows; see ApplyAdamWQuant's Fp8Blocks): m * m there. On AVX-512 the mask comes from the codes
// (VPTESTMB) and the square is a masked multiplication into m * m, so that v waits for nothing
// more than s * s.
template <class DF>
HWY_INLINE hn::Vec<DF> SquareGuardedByCode(DF df, const uint8_t *p, hn::Vec<DF> m, hn::Vec<DF> s) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DF()) == 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    return hn::Vec<DF>{
        _mm512_mask_mul_ps(hn::Mul(m, m).raw, _mm_test_epi8_mask(c, c), s.raw, s.raw)};
  }
#endif
  (void)df;
  (void)p;
  return GuardLostVOfSquare(m, hn::Mul(s, s));
}

// value(code) * scale for the N codes at p (N = Lanes(df)), as Mul(Fp8Value<F>(the codes), scale)
// bit for bit (E4M3's NaN codes give NaN: not the same NaN bits, which no result depends on: a NaN
// m makes its block or row non-finite, and the guard refuses it). scale256: scale * K (K =
// F.float16_factor(): 256, or 4096 for UE3M5), where fp8_scale_folds<F>(scale) (the caller decodes
// other blocks another way). On F16C targets through float16 (above): E4M3 code s.eeee.fff ->
// float16 bits s.0eeee.fff0000000, UE4M4 eeee.ffff -> 0eeee.ffff000000, UE3M5 eee.fffff ->
// 000eee.fffff00000; the value of those bits is the code's value / K, subnormals included; times
// scale * K (exact) it is value * scale with the reference's one rounding.
template <const Fp8Format &F, class DF>
HWY_INLINE hn::Vec<DF> Fp8Decode(DF df, const uint8_t *p, [[maybe_unused]] hn::Vec<DF> scale,
                                 [[maybe_unused]] hn::Vec<DF> scale256) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::Vec<decltype(d16)> h;
  if constexpr (F.is_signed) {
    // The code sign-extended to 16 bits, << 7: the sign in bits 15 and 14 (cleared), the
    // magnitude in 7..13.
    const auto w = hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t *>(p)));
    h = hn::BitCast(d16, hn::And(hn::ShiftLeft<7>(w), hn::Set(di16, static_cast<int16_t>(0xbfff))));
    // 0x7f and 0xff (-1 sign-extended, or 0x7f) to float16's quiet NaN.
    const auto nan = hn::RebindMask(
        d16, hn::Eq(hn::Or(w, hn::Set(di16, int16_t{-128})), hn::Set(di16, int16_t{-1})));
    h = hn::IfThenElse(nan, hn::Set(d16, uint16_t{0x7e00}), h);
  } else {
    h = hn::ShiftLeft<10 - F.mantissa_bits>(hn::PromoteTo(d16, hn::LoadU(d8, p)));
  }
  return hn::Mul(hn::PromoteTo(df, hn::BitCast(dh, h)), scale256);
#else
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  return hn::Mul(Fp8Value<F>(df, di, hn::PromoteTo(di, hn::LoadU(d8, p))), scale);
#endif
}

// Fp8Decode of codes that hold no NaN code (Fp8HasNanCode): on F16C targets E4M3 skips the NaN
// codes' mapping (otherwise, read as float16 bits, 0x7f and 0xff would decode to +-480 / 256).
template <const Fp8Format &F, class DF>
HWY_INLINE hn::Vec<DF> Fp8DecodeNoNan(DF df, const uint8_t *p, hn::Vec<DF> scale,
                                      hn::Vec<DF> scale256) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (F.is_signed) {
    const hn::Rebind<int8_t, DF> di8;
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToSigned<decltype(d16)> di16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto w = hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t *>(p)));
    const auto h =
        hn::BitCast(d16, hn::And(hn::ShiftLeft<7>(w), hn::Set(di16, static_cast<int16_t>(0xbfff))));
    return hn::Mul(hn::PromoteTo(df, hn::BitCast(dh, h)), scale256);
  }
#endif
  return Fp8Decode<F>(df, p, scale, scale256);
}

// Stores codes (the low bytes of int32 lanes: Fp8Code's lanes are 0..255, Fp8CodeInBlock's hold
// other bits above) as bytes at p: a truncation (VPMOVDB on AVX-512), which equals the saturating
// DemoteTo for lanes of 0..255 and takes fewer instructions.
template <class D8, class DI>
HWY_INLINE void StoreFp8Codes(D8 d8, DI di, hn::Vec<DI> code, uint8_t *p) {
  const hn::RebindToUnsigned<DI> du;
  (void)di;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DI()) == 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i *>(p), _mm512_cvtepi32_epi8(code.raw));  // VPMOVDB
    return;
  }
#endif
  hn::StoreU(hn::TruncateTo(d8, hn::BitCast(du, code)), d8, p);
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_FP8_CODES_HWY_INL_H_ toggle
