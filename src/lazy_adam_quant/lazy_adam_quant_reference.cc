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
#include "common/fp8_codes.h"
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

// kFp8: the FP8 state format (docs/fp8_state.md): m as E4M3 and sqrt(v) as UE4M4, decoded as
// value * scale; the scratch keeps m and sqrt(v), coded with the block's scale. Else the maps.
template <typename T, typename G, bool kFp8>
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
      float m_old, v_old;
      if constexpr (kFp8) {
        m_old = fp8_value<kE4M3>(mc[j]) * absmax_m[b];
        const float s_old = fp8_value<kUE4M4>(vc[j]) * absmax_v[b];
        v_old = s_old * s_old;
      } else {
        m_old = a.map_m.q[mc[j]] * absmax_m[b];
        v_old = a.map_v.q[vc[j]] * absmax_v[b];
      }
      if (a.guard_lost_v && v_old == 0.0f && m_old != 0.0f) v_old = m_old * m_old;
      const float m = m_old * a.beta1 + g * a.one_minus_beta1;
      const float v = std::fabs(v_old * a.beta2 + (g * g) * a.one_minus_beta2);
      const float sv = std::sqrt(v);
      const float w = to_float(var[j]) + (m * a.neg_lr) / (sv + a.epsilon);
      finite = finite && adam_produced_finite<T>(m, v, w);
      s.m[j] = m;
      s.v[j] = kFp8 ? sv : v;
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
      if constexpr (kFp8) {
        const Fp8BlockScale sm = fp8_block_scale<kE4M3>(max_m);
        const Fp8BlockScale sv = fp8_block_scale<kUE4M4>(max_v);
        absmax_m[b] = sm.scale;
        absmax_v[b] = sv.scale;
        for (int64_t j = lo; j < hi; ++j) {
          mc[j] = fp8_block_code<kE4M3>(s.m[j], sm);
          vc[j] = fp8_block_code<kUE4M4>(s.v[j], sv);
        }
        continue;
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
template <typename T, bool kFp8>
int64_t rows_of(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end, void *scratch) {
  return a.grad_dtype == DType::kFloat32 ? rows<T, float, kFp8>(a, begin, end, scratch)
                                         : rows<T, T, kFp8>(a, begin, end, scratch);
}

}  // namespace

int64_t lazy_adam_quant_rows_reference(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end,
                                       void *scratch) {
  return with_float_type(a.dtype,
                         [&]<class T>() { return rows_of<T, false>(a, begin, end, scratch); });
}

int64_t lazy_adam_quant_fp8_rows_reference(const LazyAdamQuantRowsArgs &a, int64_t begin,
                                           int64_t end, void *scratch) {
  return with_float_type(a.dtype,
                         [&]<class T>() { return rows_of<T, true>(a, begin, end, scratch); });
}

}  // namespace fusekit
