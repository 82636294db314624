// Scalar float16/bfloat16 conversions against independent float64 arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "fusekit/float16.h"

namespace {

// The float16 value of a bit pattern, computed in double from the format's definition.
double half_value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 31;
  const int mant = h & 1023;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(Float16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fusekit::half_bits_to_float(static_cast<uint16_t>(h));
    const double want = half_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(fusekit::half_bits_to_float(fusekit::float_to_half_bits(f))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << h;
    ASSERT_EQ(fusekit::float_to_half_bits(f), h) << h;
  }
}

TEST(Float16, RoundsToNearestEvenAtEveryMidpoint) {
  // Midpoints between consecutive finite halves (positive side), exact in float.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = half_value(static_cast<uint16_t>(h)),
                 hi = half_value(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t want = (h % 2 == 0) ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(fusekit::float_to_half_bits(mid), want) << "midpoint after " << h;
    ASSERT_EQ(fusekit::float_to_half_bits(-mid), want | 0x8000) << "negative midpoint after " << h;
  }
  EXPECT_EQ(fusekit::float_to_half_bits(65519.99f), 0x7bffu);
  EXPECT_EQ(fusekit::float_to_half_bits(65520.0f), 0x7c00u);  // ties to even: infinity
  EXPECT_EQ(fusekit::float_to_half_bits(1e-9f), 0u);
  EXPECT_EQ(fusekit::float_to_half_bits(INFINITY), 0x7c00u);
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(fusekit::float_to_bf16_bits(1.01171875f), 0x3f82u);  // the spec's example
  EXPECT_EQ(fusekit::float_to_bf16_bits(65520.0f), 0x4780u);
  EXPECT_EQ(fusekit::float_to_bf16_bits(1.0f), 0x3f80u);
  EXPECT_TRUE(std::isnan(fusekit::bf16_bits_to_float(fusekit::float_to_bf16_bits(NAN))));
  // Exhaustive over the upper halves with each of the interesting low halves.
  for (uint32_t hi = 0; hi < 0x7f80; ++hi) {
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = std::bit_cast<float>((hi << 16) | lo);
      const double below = fusekit::bf16_bits_to_float(static_cast<uint16_t>(hi));
      // The next bfloat16 up; past the largest finite one that is 2^128 (where rounding goes to
      // Inf).
      const double above = hi + 1 == 0x7f80
                               ? std::ldexp(1.0, 128)
                               : fusekit::bf16_bits_to_float(static_cast<uint16_t>(hi + 1));
      const double x = f;
      uint32_t want;
      if (x - below < above - x)
        want = hi;
      else if (x - below > above - x)
        want = hi + 1;
      else
        want = (hi % 2 == 0) ? hi : hi + 1;
      ASSERT_EQ(fusekit::float_to_bf16_bits(f), want) << std::hex << ((hi << 16) | lo);
    }
  }
}

}  // namespace
