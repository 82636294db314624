// fusekit tests: float16 and bfloat16 conversions written independently of the library (the
// compiler's _Float16 where it has one, else double arithmetic rounded by std::nearbyint), and
// FloatBuf, storage for a tensor in any of the three float dtypes. The oracles of AdamW and
// ApplyAdamWQuant use them.
#ifndef FUSEKIT_TESTS_COMMON_HALF_FLOATS_H_
#define FUSEKIT_TESTS_COMMON_HALF_FLOATS_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fusekit/dtype.h"
#include "fusekit/tensor.h"

namespace fusekit::testing {

// ---- independent 16-bit conversions ----------------------------------------------------------
#ifdef __FLT16_MAX__  // the compiler's _Float16 (GCC 12, clang 15 and later)
inline float half_to_float(uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}
inline uint16_t float_to_half(float f) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}
#else  // in double arithmetic, rounding by std::nearbyint (to nearest, ties to even)
inline float half_to_float(uint16_t bits) {
  const int e = (bits >> 10) & 31, mant = bits & 1023;
  const double mag = e == 31  ? (mant != 0 ? std::nan("") : INFINITY)
                     : e == 0 ? std::ldexp(mant, -24)
                              : std::ldexp(1024 + mant, e - 25);
  return static_cast<float>((bits & 0x8000) != 0 ? -mag : mag);
}
inline uint16_t float_to_half(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(f))
    return static_cast<uint16_t>(sign | 0x7e00 | ((std::bit_cast<uint32_t>(f) >> 13) & 0x3ff));
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00);
  if (a == 0.0) return sign;
  const int e = std::max(std::ilogb(a == 0 ? 1.0 : a), -14);  // the binade, subnormals at -14
  const auto q = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 10 - e)));  // <= 2048
  // q in [1024, 2048] for normals (2048: rounded up into the next binade), < 1024 subnormal.
  const uint32_t bits = q < 1024 && e == -14 ? q : static_cast<uint32_t>((e + 15) << 10) + q - 1024;
  return static_cast<uint16_t>(sign | bits);
}
#endif

inline float widen(DType t, uint16_t bits) {
  if (t == DType::kBFloat16) return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  return half_to_float(bits);
}
inline uint16_t narrow(DType t, float f) {
  if (t == DType::kFloat16) return float_to_half(f);
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t upper = x >> 16;
  const uint32_t rem = x & 0xffffu;
  if (rem > 0x8000u || (rem == 0x8000u && (upper & 1u) != 0)) ++upper;
  return static_cast<uint16_t>(upper);
}

// Storage for var or grad in any of the three dtypes.
struct FloatBuf {
  DType dtype = DType::kFloat32;
  std::vector<float> f32;
  std::vector<uint16_t> h;
  FloatBuf() = default;
  FloatBuf(DType t, const std::vector<float> &values) : dtype(t) {
    if (t == DType::kFloat32) {
      f32 = values;
    } else {
      for (float x : values) h.push_back(narrow(t, x));
    }
  }
  size_t size() const { return dtype == DType::kFloat32 ? f32.size() : h.size(); }
  float get(size_t i) const { return dtype == DType::kFloat32 ? f32[i] : widen(dtype, h[i]); }
  void set(size_t i, float x) {
    if (dtype == DType::kFloat32) {
      f32[i] = x;
    } else {
      h[i] = narrow(dtype, x);
    }
  }
  uint32_t bits(size_t i) const {
    return dtype == DType::kFloat32 ? std::bit_cast<uint32_t>(f32[i]) : h[i];
  }
  void *data() {
    return dtype == DType::kFloat32 ? static_cast<void *>(f32.data())
                                    : static_cast<void *>(h.data());
  }
  TensorView view() {
    return TensorView::contiguous(data(), dtype, {static_cast<int64_t>(size())});
  }
};

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_HALF_FLOATS_H_
