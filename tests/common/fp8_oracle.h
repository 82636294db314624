// fusekit tests: the FP8 state format (docs/fp8_state.md) as the tests' oracles compute it,
// written from the format's definition and not from the library: a code's value from its sign,
// exponent and mantissa fields in double; the nearest code by a search over every code's value
// (ties to the even code, magnitudes past the largest value saturated); the block rule spelled out
// (scale = a / MAX, inv = MAX / a, a < 2^-96 stored as a zero block).
#ifndef FUSEKIT_TESTS_COMMON_FP8_ORACLE_H_
#define FUSEKIT_TESTS_COMMON_FP8_ORACLE_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fusekit::testing {

struct Fp8Oracle {
  bool is_signed;
  int mantissa_bits;
  int max_magnitude_code;  // the largest finite magnitude's code
  float max_value;
  int bias = 7;  // the exponent bias

  // The value of a magnitude code (sign bit clear), exactly: exponent field 0 f / 2^M * 2^(1 -
  // bias), field e (1 + f / 2^M) * 2^(e - bias).
  double magnitude(int mag) const {
    const int e = mag >> mantissa_bits, f = mag & ((1 << mantissa_bits) - 1);
    const double frac = static_cast<double>(f) / (1 << mantissa_bits);
    return e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, e - bias);
  }
  float decode(uint8_t code) const {
    const int mag = is_signed ? code & 0x7f : code;
    if (is_signed && mag == 0x7f) return std::numeric_limits<float>::quiet_NaN();
    const auto x = static_cast<float>(magnitude(mag));
    return is_signed && (code & 0x80) != 0 ? -x : x;
  }
  uint8_t encode(float x) const {
    const double a = std::fabs(static_cast<double>(x));
    int best = 0;
    if (a >= magnitude(max_magnitude_code)) {  // saturated (far past it, the distances round equal)
      best = max_magnitude_code;
      if (is_signed && std::signbit(x)) best |= 0x80;
      return static_cast<uint8_t>(best);
    }
    double best_d = std::numeric_limits<double>::infinity();
    for (int mag = 0; mag <= max_magnitude_code; ++mag) {
      const double d = std::fabs(magnitude(mag) - a);
      if (d < best_d || (d == best_d && mag % 2 == 0)) {
        best = mag;
        best_d = d;
      }
    }
    if (is_signed && std::signbit(x)) best |= 0x80;
    return static_cast<uint8_t>(best);
  }
  // One block of new values x[0, len): its scale and codes.
  float code_block(const float *x, int64_t len, uint8_t *codes) const {
    float a = 0.0f;
    for (int64_t j = 0; j < len; ++j) a = std::fmax(a, std::fabs(x[j]));
    a = a + 0.0f;
    if (a < 0x1p-96f) {
      for (int64_t j = 0; j < len; ++j) codes[j] = 0;
      return 0.0f;
    }
    const float scale = a / max_value, inv = max_value / a;
    for (int64_t j = 0; j < len; ++j) codes[j] = encode(x[j] * inv);
    return scale;
  }
};

inline constexpr Fp8Oracle kOracleE4M3{true, 3, 0x7e, 448.0f};
inline constexpr Fp8Oracle kOracleUE4M4{false, 4, 0xff, 496.0f};
inline constexpr Fp8Oracle kOracleUE3M5{false, 5, 0xff, 31.5f, 3};

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_FP8_ORACLE_H_
