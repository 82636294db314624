// The embedding-bag benchmarks' inputs (EmbeddingBagLazyAdam, EmbeddingBagLazyAdamQuant): issue
// 32's batch, B bags of lo .. hi ids drawn uniformly from a table of `rows` rows (a fixed seed),
// the gradient of the pooled output, and per-sample weights when asked for; uniform fills.
#ifndef FUSEKIT_BENCHMARKS_COMMON_BAGS_H_
#define FUSEKIT_BENCHMARKS_COMMON_BAGS_H_

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "common/fill.h"

namespace fusekit::bench {

inline void fill_uniform(float *p, int64_t n, uint64_t seed, float lo, float hi) {
  xorshift_fill(n, seed, [&](int64_t i, uint64_t x) { p[i] = lo + (hi - lo) * unit_float(x); });
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct BagBatch {
  std::vector<int64_t> offsets{0}, indices;  // offsets [B + 1]
  std::vector<float> grad_output, weights;   // [B, dim]; [L] when weighted, else empty
  int64_t lookups() const { return static_cast<int64_t>(indices.size()); }
};

inline BagBatch make_bag_batch(int64_t rows, int64_t dim, int64_t bags, int lo, int hi,
                               bool weighted) {
  BagBatch b;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> len(lo, hi);
  std::uniform_int_distribution<int64_t> id(0, rows - 1);
  for (int64_t k = 0; k < bags; ++k) {
    for (int n = len(rng); n > 0; --n) b.indices.push_back(id(rng));
    b.offsets.push_back(b.lookups());
  }
  b.grad_output.resize(static_cast<size_t>(bags * dim));
  fill_uniform(b.grad_output.data(), bags * dim, 4, -1.0f, 1.0f);
  if (weighted) {
    b.weights.resize(b.indices.size());
    fill_uniform(b.weights.data(), b.lookups(), 5, 0.5f, 1.5f);
  }
  return b;
}

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_BAGS_H_
