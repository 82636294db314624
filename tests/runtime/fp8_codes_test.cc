// The FP8 state formats' scalar codes (E4M3, UE4M4, UE3M5) (src/common/fp8_codes.h) against the
// oracle written from the format's definition (tests/common/fp8_oracle.h): every code's value,
// every code back to itself, exact midpoints (ties to even), the subnormal range, saturation, and
// random values over the whole range. The SIMD codes are checked through the kernels on every
// target (the operators' tests), against the same oracle.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "common/fp8_codes.h"
#include "common/fp8_oracle.h"
#include "common/test_util.h"

namespace {

using fusekit::kE4M3;
using fusekit::kUE3M5;
using fusekit::kUE4M4;
using fusekit::testing::kOracleE4M3;
using fusekit::testing::kOracleUE3M5;
using fusekit::testing::kOracleUE4M4;

template <const fusekit::Fp8Format &F>
void check_format(const fusekit::testing::Fp8Oracle &o, uint64_t salt) {
  // Every code's value, and every finite code back to itself.
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float got = fusekit::fp8_value<F>(code), want = o.decode(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_TRUE(fusekit::testing::bits_equal(got, want))
        << "code " << c << ": " << got << " vs " << want;
    EXPECT_EQ(fusekit::fp8_code<F>(got), code) << "code " << c;
  }
  // Midpoints between neighbouring magnitudes, and a hair either side of each (exact in float32).
  for (int mag = 0; mag < o.max_magnitude_code; ++mag) {
    const auto mid = static_cast<float>((o.magnitude(mag) + o.magnitude(mag + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      EXPECT_EQ(fusekit::fp8_code<F>(x), o.encode(x)) << "x = " << x;
      if (F.is_signed) {
        EXPECT_EQ(fusekit::fp8_code<F>(-x), o.encode(-x)) << "x = " << -x;
      }
    }
  }
  // Saturation, zeros, the sign of zero.
  for (float x : {F.max_value, F.max_value * 1.03f, F.max_value * 1.2f, 1e30f, 0.0f, -0.0f,
                  0x1p-30f, -0x1p-30f, 1e-40f, F.min_normal(), std::nextafter(F.min_normal(), 0.0f),
                  F.subnormal_unit() / 2, std::nextafter(F.subnormal_unit() / 2, 1.0f)}) {
    EXPECT_EQ(fusekit::fp8_code<F>(x), o.encode(x)) << "x = " << x;
  }
  // Random magnitudes, log-uniform over 2^-16 .. 2^10, both signs.
  auto rng = fusekit::testing::rng_for(salt);
  std::uniform_real_distribution<float> exponent(-16.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(exponent(rng));
    if (F.is_signed && (rng() & 1)) x = -x;
    ASSERT_EQ(fusekit::fp8_code<F>(x), o.encode(x)) << "x = " << x;
  }
}

TEST(Fp8Codes, E4M3MatchesItsDefinition) {
  check_format<kE4M3>(kOracleE4M3, 8801);
}

TEST(Fp8Codes, UE4M4MatchesItsDefinition) {
  check_format<kUE4M4>(kOracleUE4M4, 8802);
}

TEST(Fp8Codes, UE3M5MatchesItsDefinition) {
  check_format<kUE3M5>(kOracleUE3M5, 8803);
}

// The constants the SIMD code derives from a format, against the oracle's values.
TEST(Fp8Codes, DerivedConstants) {
  for (const auto &[f, o] : {std::pair{&kE4M3, &kOracleE4M3}, std::pair{&kUE4M4, &kOracleUE4M4},
                             std::pair{&kUE3M5, &kOracleUE3M5}}) {
    EXPECT_EQ(static_cast<double>(f->min_normal()), o->magnitude(1 << o->mantissa_bits));
    EXPECT_EQ(static_cast<double>(f->subnormal_unit()), o->magnitude(1));
    EXPECT_EQ(std::bit_cast<uint32_t>(f->min_normal()), f->min_normal_bits());
    EXPECT_EQ(static_cast<double>(f->max_value), o->magnitude(o->max_magnitude_code));
    EXPECT_EQ(static_cast<double>(f->float16_factor()), std::ldexp(1.0, 15 - o->bias));
  }
}

TEST(Fp8Codes, BlockScaleAndTheZeroBlock) {
  // The scale and the multiplier as the definition computes them; below 2^-96 a zero block.
  for (float a : {1.0f, 3.7e-5f, 448.0f, 1e20f, 0x1p-96f}) {
    const fusekit::Fp8BlockScale s = fusekit::fp8_block_scale<kE4M3>(a);
    EXPECT_TRUE(fusekit::testing::bits_equal(s.scale, a / 448.0f)) << a;
    EXPECT_TRUE(fusekit::testing::bits_equal(s.inv, 448.0f / a)) << a;
  }
  for (float a : {0.0f, 0x1p-97f, 1e-40f}) {
    const fusekit::Fp8BlockScale s = fusekit::fp8_block_scale<kUE4M4>(a);
    EXPECT_EQ(s.scale, 0.0f);
    EXPECT_EQ(fusekit::fp8_block_code<kE4M3>(-0x1p-98f, s), 0);  // 0, not the -0 code 0x80
  }
  // The largest element of a block codes to the largest value (or saturates to it).
  for (float a : {1.0f, 0.3f, 7.1e-12f, 3.3e15f}) {
    const fusekit::Fp8BlockScale s = fusekit::fp8_block_scale<kUE4M4>(a);
    EXPECT_EQ(fusekit::fp8_block_code<kUE4M4>(a, s), 0xff) << a;
    const fusekit::Fp8BlockScale sm = fusekit::fp8_block_scale<kE4M3>(a);
    EXPECT_EQ(fusekit::fp8_block_code<kE4M3>(-a, sm), 0xfe) << a;
    const fusekit::Fp8BlockScale s5 = fusekit::fp8_block_scale<kUE3M5>(a);
    EXPECT_TRUE(fusekit::testing::bits_equal(s5.scale, a / 31.5f)) << a;
    EXPECT_EQ(fusekit::fp8_block_code<kUE3M5>(a, s5), 0xff) << a;
  }
}

}  // namespace
