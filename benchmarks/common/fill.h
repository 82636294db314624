// The benchmarks' inputs: [0, n) filled in parallel (OpenMP), each thread with its own xorshift64
// stream from `seed` (the values depend on the thread count, which is fine for timing).
#ifndef FUSEKIT_BENCHMARKS_COMMON_FILL_H_
#define FUSEKIT_BENCHMARKS_COMMON_FILL_H_

#include <omp.h>

#include <cstdint>

namespace fusekit::bench {

// store(i, x) writes element i from the stream's next value x.
template <class Store>
void xorshift_fill(int64_t n, uint64_t seed, Store &&store) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(t) + 1;
    for (int64_t i = n * t / nt; i < n * (t + 1) / nt; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      store(i, x);
    }
  }
}

// x's top 24 bits as a float in [0, 1).
inline float unit_float(uint64_t x) {
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_FILL_H_
