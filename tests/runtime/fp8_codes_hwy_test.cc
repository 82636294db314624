// The FP8 state format's SIMD codes (src/common/fp8_codes_hwy-inl.h) on every SIMD target Highway
// built and this CPU runs, against the scalar ones (src/common/fp8_codes.h, themselves checked
// against the oracle by fp8_codes_test.cc): Fp8CodeInBlock, the coding of ApplyAdamWQuant's FP8
// kernel (a float32 addition in place of the integer rounding and no saturation), over the whole
// range a block codes (|x| up to the largest value rounded up twice, 448, 496 or 31.5 times
// (1 + 2^-22); UE3M5 is sqrt(v)'s format of state format fp8_ue3m5):
// every 61st float32 of it, and every float32 within 64 ulps of each midpoint between two codes
// (the ties and their neighbours), both signs for E4M3. (Every float32 of the range was checked
// once, on every target, when the function was written: 2026-12-07, no mismatch.)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "runtime/fp8_codes_hwy_test.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <bit>
#include <cstdint>

#include "common/fp8_codes_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The floats of bit patterns lo, lo + step, ... up to hi (with `sign` or-ed in) whose
// Fp8CodeInBlock<F> low byte is not fp8_code<F>.
template <const Fp8Format &F>
int64_t MismatchesOf(uint32_t lo, uint32_t hi, uint32_t step, uint32_t sign) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  HWY_ALIGN float x[HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN int32_t code[HWY_MAX_BYTES / sizeof(float)];
  int64_t bad = 0;
  for (uint64_t b = lo; b <= hi; b += uint64_t{step} * N) {
    for (size_t k = 0; k < N; ++k) {
      const uint64_t u = b + uint64_t{step} * k;
      x[k] = std::bit_cast<float>(static_cast<uint32_t>(u <= hi ? u : hi) | sign);
    }
    hn::Store(Fp8CodeInBlock<F>(df, di, hn::Load(df, x)), di, code);
    for (size_t k = 0; k < N; ++k)
      bad += static_cast<uint8_t>(code[k]) != fp8_code<F>(x[k]) ? 1 : 0;
  }
  return bad;
}

int64_t Fp8CodeInBlockMismatches(int format, uint32_t lo, uint32_t hi, uint32_t step,
                                 uint32_t sign) {
  switch (format) {
    case 0:
      return MismatchesOf<kE4M3>(lo, hi, step, sign);
    case 1:
      return MismatchesOf<kUE4M4>(lo, hi, step, sign);
    default:
      return MismatchesOf<kUE3M5>(lo, hi, step, sign);
  }
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <algorithm>

#include "common/fp8_oracle.h"
#include "common/simd_targets.h"

namespace fusekit {
HWY_EXPORT(Fp8CodeInBlockMismatches);
namespace {

int64_t mismatches(int format, uint32_t lo, uint32_t hi, uint32_t step, uint32_t sign) {
  return HWY_DYNAMIC_DISPATCH(Fp8CodeInBlockMismatches)(format, lo, hi, step, sign);
}

void check_format(int format, const Fp8Format &f, const testing::Fp8Oracle &o) {
  // The largest |x| a block codes: MAX * (1 + 2^-22), and a few ulps more.
  const uint32_t top = std::bit_cast<uint32_t>(f.max_value * (1.0f + 0x1p-22f)) + 4;
  for (const uint32_t sign : {0u, 0x80000000u}) {
    if (sign != 0 && !f.is_signed) continue;
    testing::for_each_simd_target([&](const char *) {
      EXPECT_EQ(mismatches(format, 0, top, 61, sign), 0);
      for (int mag = 0; mag < o.max_magnitude_code; ++mag) {
        const auto mid = static_cast<float>((o.magnitude(mag) + o.magnitude(mag + 1)) / 2);
        const uint32_t b = std::bit_cast<uint32_t>(mid);
        ASSERT_EQ(mismatches(format, b - std::min<uint32_t>(b, 64), std::min(b + 64, top), 1, sign),
                  0)
            << "around " << mid;
      }
      EXPECT_EQ(mismatches(format, 0, 256, 1, sign), 0);  // zero and the smallest subnormals
    });
  }
}

TEST(Fp8CodesSimd, CodeInBlockE4M3MatchesTheScalarCode) {
  check_format(0, kE4M3, testing::kOracleE4M3);
}

TEST(Fp8CodesSimd, CodeInBlockUE4M4MatchesTheScalarCode) {
  check_format(1, kUE4M4, testing::kOracleUE4M4);
}

TEST(Fp8CodesSimd, CodeInBlockUE3M5MatchesTheScalarCode) {
  check_format(2, kUE3M5, testing::kOracleUE3M5);
}

}  // namespace
}  // namespace fusekit
#endif  // HWY_ONCE
