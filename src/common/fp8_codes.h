// fusekit internal: the FP8 state formats of the 8-bit optimizers (docs/fp8_state.md), one element
// at a time: m as E4M3 (float8_e4m3fn), sqrt(v) as UE4M4 (unsigned, 4 exponent bits with bias 7,
// 4 mantissa bits; state format fp8) or UE3M5 (unsigned, 3 exponent bits with bias 3, 5 mantissa
// bits; state format fp8_ue3m5, ApplyAdamWQuant only), one float32 scale per block. The reference
// kernels use these functions; the SIMD ones (common/fp8_codes_hwy-inl.h) perform the same
// operations on vectors, bit for bit.
#ifndef FUSEKIT_COMMON_FP8_CODES_H_
#define FUSEKIT_COMMON_FP8_CODES_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fusekit {

// The three codes, described by their widths: E4M3 (signed, 3 mantissa bits, exponent bias 7,
// codes 0x7f and 0xff are NaN, largest 448), UE4M4 (unsigned, 4 mantissa bits, bias 7, every code
// finite, largest 496) and UE3M5 (unsigned, 5 mantissa bits, bias 3, every code finite, largest
// 31.5). A code's exponent field 0 holds the multiples of 2^(1 - bias - mantissa bits) below the
// first normal 2^(1 - bias); field e > 0 the values 2^(e - bias) * (1 + f / 2^mantissa bits).
struct Fp8Format {
  int mantissa_bits;
  bool is_signed;
  float max_value;
  uint32_t max_code;  // the largest code of a magnitude (0x7e: 448; 0xff: 496, 31.5)
  int bias;           // the exponent bias (7, 7, 3)

  // The first normal value 2^(1 - bias) and its float32 bits.
  constexpr float min_normal() const { return pow2(1 - bias); }
  constexpr uint32_t min_normal_bits() const { return static_cast<uint32_t>(128 - bias) << 23; }
  // The value of a code of exponent field 0 is its mantissa times this: 2^(1 - bias - M).
  constexpr float subnormal_unit() const { return pow2(1 - bias - mantissa_bits); }
  // A power of two whose float32 ulp is subnormal_unit(): 2^(24 - bias - M).
  constexpr float subnormal_magic() const { return pow2(24 - bias - mantissa_bits); }
  // 127 - bias: a normal code's exponent field plus this is the float32 exponent field.
  constexpr uint32_t rebias() const { return static_cast<uint32_t>(127 - bias); }
  // The float16 bits of a magnitude code shifted left by 10 - M have the value value(code) /
  // 2^(15 - bias) (float16's exponent layout with bias 15; its subnormals are the code's): this
  // factor.
  constexpr float float16_factor() const { return pow2(15 - bias); }

  static constexpr float pow2(int e) {
    float x = 1.0f;
    for (; e > 0; --e) x *= 2.0f;
    for (; e < 0; ++e) x *= 0.5f;
    return x;
  }
};
inline constexpr Fp8Format kE4M3{3, true, 448.0f, 0x7e, 7};
inline constexpr Fp8Format kUE4M4{4, false, 496.0f, 0xff, 7};
inline constexpr Fp8Format kUE3M5{5, false, 31.5f, 0xff, 3};
static_assert(kE4M3.subnormal_unit() == 0x1p-9f && kUE4M4.subnormal_unit() == 0x1p-10f &&
              kUE3M5.subnormal_unit() == 0x1p-7f);
static_assert(kUE3M5.min_normal_bits() == 0x3e800000u && kE4M3.min_normal_bits() == 0x3c800000u);

// A block whose largest magnitude is below this is stored as zero (scale 0, every code 0): then
// max_value / a never overflows.
inline constexpr float kFp8MinBlockMax = 0x1p-96f;

// The value of a code, exact in float32. E4M3's NaN codes (0x7f, 0xff) read as NaN.
template <const Fp8Format &F>
inline float fp8_value(uint8_t code) {
  constexpr int M = F.mantissa_bits;
  const uint32_t mag = F.is_signed ? code & 0x7fu : code;
  if (F.is_signed && mag == 0x7fu) return std::numeric_limits<float>::quiet_NaN();
  float x;
  if (mag < (1u << M)) {  // exponent field 0: f * 2^(1 - bias - M)
    x = static_cast<float>(mag) * F.subnormal_unit();
  } else {  // rebias the exponent from the format's bias to 127 and widen the mantissa
    x = std::bit_cast<float>((mag << (23 - M)) + (F.rebias() << 23));
  }
  return F.is_signed && (code & 0x80u) != 0 ? -x : x;
}

// The nearest code of a finite float32 x, ties to even, magnitudes above the largest saturated.
template <const Fp8Format &F>
inline uint8_t fp8_code(float x) {
  constexpr int M = F.mantissa_bits;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t b = bits & 0x7fffffffu;
  const float a = std::bit_cast<float>(b);
  uint32_t code;
  if (a < F.min_normal()) {  // below the first normal: a multiple of 2^(1 - bias - M), by a
                             // float32 addition
    constexpr float kMagic = F.subnormal_magic();  // its ulp is 2^(1 - bias - M)
    code = std::bit_cast<uint32_t>(a + kMagic) - std::bit_cast<uint32_t>(kMagic);
  } else {
    constexpr int S = 23 - M;
    code = ((b + ((1u << (S - 1)) - 1u) + ((b >> S) & 1u)) >> S) - (F.rebias() << M);
  }
  code = std::min(code, F.max_code);
  if (F.is_signed) code |= (bits >> 31) << 7;
  return static_cast<uint8_t>(code);
}

// A block's scale and the multiplier that codes it, from its largest magnitude `a` (+0 added):
// a < 2^-96 gives scale 0 and inv 0 (every x * 0 codes to 0 or -0; see fp8_block_codes below).
struct Fp8BlockScale {
  float scale, inv;
};
template <const Fp8Format &F>
inline Fp8BlockScale fp8_block_scale(float a) {
  if (!(a >= kFp8MinBlockMax)) return {0.0f, 0.0f};
  return {a / F.max_value, F.max_value / a};
}

// Whether a block's scale can be folded with the factor of the SIMD decode (common/
// fp8_codes_hwy-inl.h, Fp8Decode: value(code) / K * (scale * K), K = F.float16_factor(): 256 for
// E4M3 and UE4M4, 4096 for UE3M5; value(code) * scale when scale * K is exact): every scale but a
// finite one whose * K overflows.
template <const Fp8Format &F>
inline bool fp8_scale_folds(float scale) {
  return !(std::isfinite(scale) &&
           std::fabs(scale) > std::numeric_limits<float>::max() / F.float16_factor());
}

// The code of x in a block of that scale: fp8_code(x * inv); a zero block codes every element 0
// (E4M3 writes 0, not the -0 that a negative x * 0 would give).
template <const Fp8Format &F>
inline uint8_t fp8_block_code(float x, const Fp8BlockScale &s) {
  return s.inv == 0.0f ? uint8_t{0} : fp8_code<F>(x * s.inv);
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_FP8_CODES_H_
