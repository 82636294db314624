// EmbeddingBagLazyAdam, the plain scalar kernel. The same float32 operations in the same order as
// the optimized kernel and the NumPy golden (docs/embedding_bag_lazy_adam.md), so all three agree
// bit for bit.
#include <cmath>

#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_kernels.h"

namespace fusekit {

int64_t embedding_bag_lazy_adam_rows_reference(const EmbeddingBagLazyAdamRowsArgs &a, int64_t begin,
                                               int64_t end, float *scratch) {
  const int64_t D = a.dim;
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    const uint64_t row = a.entries[k] >> 32;
    // g: the row's lookups in order, x_i = grad_output[b_i] * c_i, c_i = s_b * w_i.
    k = bag_row_gradient_reference(a.bags, a.entries, k, end, D, scratch);

    bool finite = true;
    for (int64_t j = 0; j < D; ++j) finite = finite && std::isfinite(scratch[j]);
    if (!finite) {
      ++skipped;
      continue;
    }
    const auto r = static_cast<int64_t>(row);
    float *m = a.m + r * a.m_stride;
    float *v = a.v + r * a.v_stride;
    float *var = a.var + r * a.var_stride;
    for (int64_t j = 0; j < D; ++j) {
      const float g = scratch[j];
      const float mj = m[j] * a.beta1 + g * a.one_minus_beta1;
      const float vj = std::fabs(v[j] * a.beta2 + (g * g) * a.one_minus_beta2);
      const float denom = std::sqrt(vj) + a.epsilon;
      m[j] = mj;
      v[j] = vj;
      var[j] = var[j] + (mj * a.neg_lr) / denom;
    }
  }
  return skipped;
}

}  // namespace fusekit
