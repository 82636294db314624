// fusekit internal: the FP8 state format of the 8-bit optimizers (docs/fp8_state.md), one element
// at a time: m as E4M3 (float8_e4m3fn), sqrt(v) as UE4M4 (unsigned, 4 exponent bits with bias 7,
// 4 mantissa bits), one float32 scale per block. The reference kernels use these functions; the
// SIMD ones (common/fp8_codes_hwy-inl.h) perform the same operations on vectors, bit for bit.
#ifndef FUSEKIT_COMMON_FP8_CODES_H_
#define FUSEKIT_COMMON_FP8_CODES_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fusekit {

// The two codes, described by their widths: E4M3 (signed, 3 mantissa bits, codes 0x7f and 0xff
// are NaN, largest 448) and UE4M4 (unsigned, 4 mantissa bits, every code finite, largest 496).
struct Fp8Format {
  int mantissa_bits;
  bool is_signed;
  float max_value;
  uint32_t max_code;  // the largest code of a magnitude (0x7e: 448; 0xff: 496)
};
inline constexpr Fp8Format kE4M3{3, true, 448.0f, 0x7e};
inline constexpr Fp8Format kUE4M4{4, false, 496.0f, 0xff};

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
  if (mag < (1u << M)) {  // exponent field 0: f * 2^(-6 - M)
    x = static_cast<float>(mag) * (F.mantissa_bits == 3 ? 0x1p-9f : 0x1p-10f);
  } else {  // rebias the exponent from 7 to 127 and widen the mantissa
    x = std::bit_cast<float>((mag << (23 - M)) + (120u << 23));
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
  if (a < 0x1p-6f) {  // below the first normal: a multiple of 2^(-6 - M), by a float32 addition
    constexpr float kMagic = F.mantissa_bits == 3 ? 0x1p14f : 0x1p13f;  // its ulp is 2^(-6 - M)
    code = std::bit_cast<uint32_t>(a + kMagic) - std::bit_cast<uint32_t>(kMagic);
  } else {
    constexpr int S = 23 - M;
    code = ((b + ((1u << (S - 1)) - 1u) + ((b >> S) & 1u)) >> S) - (120u << M);
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

// Whether a block's scale can be folded with the 256 of the SIMD decode (common/
// fp8_codes_hwy-inl.h, Fp8Decode: value(code) / 256 * (scale * 256), which is value(code) * scale
// when scale * 256 is exact): every scale but a finite one whose * 256 overflows.
inline bool fp8_scale_folds(float scale) {
  return !(std::isfinite(scale) && std::fabs(scale) > std::numeric_limits<float>::max() / 256.0f);
}

// The code of x in a block of that scale: fp8_code(x * inv); a zero block codes every element 0
// (E4M3 writes 0, not the -0 that a negative x * 0 would give).
template <const Fp8Format &F>
inline uint8_t fp8_block_code(float x, const Fp8BlockScale &s) {
  return s.inv == 0.0f ? uint8_t{0} : fp8_code<F>(x * s.inv);
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_FP8_CODES_H_
