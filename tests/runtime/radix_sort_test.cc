// The grouping sort: stable, and the same output for every thread count, against std::stable_sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/radix_sort.h"
#include "common/test_util.h"

namespace {

TEST(RadixSort, StableAndThreadCountInvariant) {
  auto rng = fusekit::testing::rng_for(900);
  for (int64_t n : {0, 1, 2, 7, 1000, 100003}) {
    for (int bits : {1, 5, 11, 12, 21, 31}) {
      std::vector<uint64_t> keys(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t field = rng() & ((uint64_t{1} << bits) - 1);
        keys[static_cast<size_t>(i)] = (field << 32) | static_cast<uint64_t>(i);
      }
      std::vector<uint64_t> want = keys;
      std::stable_sort(want.begin(), want.end(),
                       [](uint64_t a, uint64_t b) { return (a >> 32) < (b >> 32); });
      for (int threads : {1, 2, 3, 4}) {
        std::vector<uint64_t> a = keys, tmp(keys.size()),
                              hist(fusekit::radix_sort_scratch_bytes(threads) / 8);
        const uint64_t *out =
            fusekit::radix_sort_u64(a.data(), tmp.data(), n, 32, bits, hist.data(), threads, 0);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), out))
            << "n=" << n << " bits=" << bits << " threads=" << threads;
      }
    }
  }
}

}  // namespace
