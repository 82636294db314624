// LazyAdam, the plain scalar kernel. Same float32 operations in the same order as the optimized
// kernel and the NumPy golden, so all three agree bit for bit.
#include <cmath>
#include <cstring>

#include "lazy_adam/lazy_adam_kernels.h"

namespace fusekit {

int64_t lazy_adam_rows_reference(const LazyAdamRowsArgs &a, int64_t begin, int64_t end,
                                 float *scratch) {
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    const uint64_t row = a.entries[k] >> 32;
    // The summed gradient of this row: its occurrences in order.
    std::memcpy(scratch, a.grad + static_cast<int64_t>(a.entries[k] & 0xffffffffu) * a.grad_stride,
                static_cast<size_t>(a.dim) * sizeof(float));
    int64_t next = k + 1;
    for (; next < end && (a.entries[next] >> 32) == row; ++next) {
      const float *g = a.grad + static_cast<int64_t>(a.entries[next] & 0xffffffffu) * a.grad_stride;
      for (int64_t j = 0; j < a.dim; ++j) scratch[j] = scratch[j] + g[j];
    }
    k = next;
    if (row >= a.row_limit) continue;  // padding

    bool finite = true;
    for (int64_t j = 0; j < a.dim; ++j) finite = finite && std::isfinite(scratch[j]);
    if (!finite) {
      ++skipped;
      continue;
    }
    const auto r = static_cast<int64_t>(row);
    float *m = a.m + r * a.m_stride;
    float *v = a.v + r * a.v_stride;
    float *var = a.var + r * a.var_stride;
    for (int64_t j = 0; j < a.dim; ++j) {
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
