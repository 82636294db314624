// fusekit tests: seeded random data, poisoning, and comparisons. Every random input comes from a
// seed that the failing test prints (SCOPED_TRACE), so a failure can be replayed.
#ifndef FUSEKIT_TESTS_COMMON_TEST_UTIL_H_
#define FUSEKIT_TESTS_COMMON_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fusekit::testing {

// The base seed of the whole suite; FUSEKIT_TEST_SEED overrides it.
inline uint64_t base_seed() {
  const char *s = std::getenv("FUSEKIT_TEST_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 20261130ull;
}

inline std::mt19937_64 rng_for(uint64_t salt) {
  return std::mt19937_64(base_seed() * 1000003ull + salt);
}

inline std::vector<float> uniform(std::mt19937_64 &rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (auto &x : out) x = dist(rng);
  return out;
}

// A NaN with a payload no kernel produces: an element still holding it was never written.
inline float poison_float() {
  return std::bit_cast<float>(0x7fa5a5a5u);
}
inline bool is_poison(float f) {
  return std::bit_cast<uint32_t>(f) == 0x7fa5a5a5u;
}

inline bool bits_equal(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Counts positions where two float arrays differ bitwise; reports the first few.
inline size_t count_bit_mismatches(const float *got, const float *want, size_t n, const char *what,
                                   size_t report = 3) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!bits_equal(got[i], want[i])) {
      if (bad < report) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " (0x" << std::hex
                      << std::bit_cast<uint32_t>(got[i]) << "), want " << want[i] << " (0x"
                      << std::bit_cast<uint32_t>(want[i]) << std::dec << ")";
      }
      ++bad;
    }
  }
  return bad;
}

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_TEST_UTIL_H_
