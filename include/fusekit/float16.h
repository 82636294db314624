// fusekit: scalar conversions between float and the 16-bit float formats. Round to nearest, ties
// to even; NaN stays NaN (quieted), infinities stay infinite, float16 subnormals are exact.
#ifndef FUSEKIT_FLOAT16_H_
#define FUSEKIT_FLOAT16_H_

#include <bit>
#include <cstdint>

#include "fusekit/dtype.h"

namespace fusekit {

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float r = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(r));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (a > 0x7f800000u ? (0x200u | ((a >> 13) & 0x3ffu)) : 0u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5f rounds |f| to a multiple of 2^-24 (the
    // half subnormal step) with the FPU's round-to-nearest-even; the low bits are the result.
    const float r = std::bit_cast<float>(a) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

inline float bf16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float to_float(float v) {
  return v;
}
inline float to_float(float16_t v) {
  return half_bits_to_float(v.bits);
}
inline float to_float(bfloat16_t v) {
  return bf16_bits_to_float(v.bits);
}

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline float16_t from_float<float16_t>(float f) {
  return {float_to_half_bits(f)};
}
template <>
inline bfloat16_t from_float<bfloat16_t>(float f) {
  return {float_to_bf16_bits(f)};
}

}  // namespace fusekit

#endif  // FUSEKIT_FLOAT16_H_
