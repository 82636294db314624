// fusekit tests: the embedding-bag optimizers' row gradient (docs/embedding_bag_lazy_adam.md) as
// their oracles compute it, written from the doc and not from the library: the bag of a lookup
// found by searching the offsets, the lookups of a row grouped with std::map, plain float32 loops.
// EmbeddingBagLazyAdam's oracle ends in LazyAdam's step, EmbeddingBagLazyAdamQuant's in
// tests/common/lazy_adam_quant_oracle.h's row step.
#ifndef FUSEKIT_TESTS_COMMON_EMBEDDING_BAG_ORACLE_H_
#define FUSEKIT_TESTS_COMMON_EMBEDDING_BAG_ORACLE_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "fusekit/embedding_bag_lazy_adam.h"  // PoolingMode

namespace fusekit::testing {

// The pooling modes the tests run, with and without per-sample weights.
struct BagMode {
  PoolingMode pooling;
  bool weighted;
};
inline constexpr BagMode kBagModes[] = {{PoolingMode::kSum, false},
                                        {PoolingMode::kSum, true},
                                        {PoolingMode::kMean, false},
                                        {PoolingMode::kMean, true}};
inline const char *mode_name(const BagMode &m) {
  return m.pooling == PoolingMode::kMean ? (m.weighted ? "mean, weighted" : "mean")
                                         : (m.weighted ? "sum, weighted" : "sum");
}

// Row -> its gradient g [dim]: over the row's lookups i in order, x_i = grad[b_i] * c_i
// (c_i = s_b * w_i), g = x_i1, then g = g + x_ik. grad is [bags, grad_stride]; off [bags + 1];
// weights [L] or empty.
inline std::map<int64_t, std::vector<float>> oracle_bag_gradients(
    const std::vector<float> &grad, int64_t grad_stride, const std::vector<int64_t> &idx,
    const std::vector<int64_t> &off, const std::vector<float> &weights, PoolingMode pooling,
    int64_t dim) {
  std::map<int64_t, std::vector<int64_t>> lookups_of;  // row -> lookups in order
  for (size_t i = 0; i < idx.size(); ++i) lookups_of[idx[i]].push_back(static_cast<int64_t>(i));
  std::map<int64_t, std::vector<float>> out;
  for (const auto &[row, lookups] : lookups_of) {
    std::vector<float> g(static_cast<size_t>(dim));
    for (size_t k = 0; k < lookups.size(); ++k) {
      const int64_t i = lookups[k];
      // The bag holding lookup i: the last b with off[b] <= i (a non-empty bag).
      const auto it = std::upper_bound(off.begin(), off.end(), i);
      const int64_t b = (it - off.begin()) - 1;
      const int64_t len = off[static_cast<size_t>(b + 1)] - off[static_cast<size_t>(b)];
      const float s = pooling == PoolingMode::kMean ? 1.0f / static_cast<float>(len) : 1.0f;
      const float w = weights.empty() ? 1.0f : weights[static_cast<size_t>(i)];
      const float coef = s * w;
      for (int64_t j = 0; j < dim; ++j) {
        const float x = grad[static_cast<size_t>(b * grad_stride + j)] * coef;
        g[static_cast<size_t>(j)] = k == 0 ? x : g[static_cast<size_t>(j)] + x;
      }
    }
    out.emplace(row, std::move(g));
  }
  return out;
}

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_EMBEDDING_BAG_ORACLE_H_
