// LazyAdamQuant, the plain scalar kernel (cpu_reference): one element at a time, the same float32
// operations in the same order as the optimized kernels and the NumPy golden (bitwise equal). Each
// row is computed into the scratch buffers and stored only when every new m, v and var (as stored)
// of the row is finite (common/adam_update.h's predicate); otherwise the row is left unchanged and
// counted (a NaN or Inf summed gradient is one case).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/adam_update.h"
#include "common/float_types.h"
#include "fusekit/float16.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

namespace fusekit {
namespace {

template <typename G>
const G *grad_row(const LazyAdamQuantRowsArgs &a, uint64_t entry) {
  return static_cast<const G *>(a.grad) + static_cast<int64_t>(entry & 0xffffffffu) * a.grad_stride;
}

// g = the row's gradient summed in order of occurrence, in float32.
template <typename G>
void sum_gradient(const LazyAdamQuantRowsArgs &a, int64_t k, int64_t next, float *g) {
  const G *g0 = grad_row<G>(a, a.entries[k]);
  for (int64_t j = 0; j < a.dim; ++j) g[j] = to_float(g0[j]);
  for (int64_t q = k + 1; q < next; ++q) {
    const G *h = grad_row<G>(a, a.entries[q]);
    for (int64_t j = 0; j < a.dim; ++j) g[j] = g[j] + to_float(h[j]);
  }
}

template <typename T, typename G>
int64_t rows(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end, void *scratch_mem) {
  const LaqScratch s = laq_scratch(scratch_mem, a.dim);
  const int64_t D = a.dim;
  int64_t skipped = 0;
  int64_t k = begin;
  while (k < end) {
    const uint64_t row = a.entries[k] >> 32;
    const int64_t next = laq_group_end(a, k, end);
    if (row >= a.row_limit) {  // padding
      k = next;
      continue;
    }
    sum_gradient<G>(a, k, next, s.g);
    k = next;
    const auto [var, mc, vc, absmax_m, absmax_v] = laq_row<T>(a, static_cast<int64_t>(row));
    // Dequantize, update, check; nothing is stored yet.
    bool finite = true;
    for (int64_t j = 0; j < D; ++j) {
      const int64_t b = j / kLaqBlock;
      const float g = s.g[j];
      const float m = a.map_m.q[mc[j]] * absmax_m[b] * a.beta1 + g * a.one_minus_beta1;
      const float v =
          std::fabs(a.map_v.q[vc[j]] * absmax_v[b] * a.beta2 + (g * g) * a.one_minus_beta2);
      const float w = to_float(var[j]) + (m * a.neg_lr) / (std::sqrt(v) + a.epsilon);
      finite = finite && adam_produced_finite<T>(m, v, w);
      s.m[j] = m;
      s.v[j] = v;
      s.w[j] = w;
    }
    if (!finite) {
      ++skipped;
      continue;
    }
    // Store var and, per block, absmax and the codes.
    for (int64_t j = 0; j < D; ++j) var[j] = from_float<T>(s.w[j]);
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int64_t lo = b * kLaqBlock, hi = std::min(D, lo + kLaqBlock);
      float max_m = 0.0f, max_v = 0.0f;
      for (int64_t j = lo; j < hi; ++j) {
        max_m = std::max(max_m, std::fabs(s.m[j]));
        max_v = std::max(max_v, s.v[j]);
      }
      absmax_m[b] = max_m;
      absmax_v[b] = max_v;
      const float div_m = max_m == 0.0f ? 1.0f : max_m;
      const float div_v = max_v == 0.0f ? 1.0f : max_v;
      for (int64_t j = lo; j < hi; ++j) {
        mc[j] = quant_code_reference(a.map_m, s.m[j] / div_m);
        vc[j] = quant_code_reference(a.map_v, s.v[j] / div_v);
      }
    }
  }
  return skipped;
}

// The gradient float32, or var's dtype T.
template <typename T>
int64_t rows_of(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end, void *scratch) {
  return a.grad_dtype == DType::kFloat32 ? rows<T, float>(a, begin, end, scratch)
                                         : rows<T, T>(a, begin, end, scratch);
}

}  // namespace

int64_t lazy_adam_quant_rows_reference(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end,
                                       void *scratch) {
  return with_float_type(a.dtype, [&]<class T>() { return rows_of<T>(a, begin, end, scratch); });
}

}  // namespace fusekit
