// ApplyAdamWQuant, the plain scalar kernel (cpu_reference): one element at a time, the same float32
// operations in the same order as the optimized kernels and the NumPy golden (bitwise equal).
// Each block is computed into local buffers and stored only when every new m, v and var (as
// stored) is finite (then so are its absmax); otherwise the block is left unchanged and counted
// (common/adam_update.h; a NaN or Inf gradient is one case).
#include <algorithm>
#include <cmath>
#include <limits>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/float_types.h"
#include "common/fp8_codes.h"
#include "fusekit/float16.h"

namespace fusekit {
namespace {

constexpr int64_t kBlock = 256;

// kFp8: an FP8 state format (docs/fp8_state.md): m as E4M3 and sqrt(v) as FV (UE4M4 or UE3M5),
// decoded as value * scale; the buffers keep m and sqrt(v), coded with the block's scale. Else the
// dynamic maps (FV unused).
template <typename T, bool kFp8, const Fp8Format &FV = kUE4M4>
int64_t quant_blocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  int64_t skipped = 0;
  float m_new[kBlock], v_new[kBlock], w_new[kBlock];
  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, a.n - lo);
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const float scale_m = *absmax_m, scale_v = *absmax_v;
    float max_m = 0.0f, max_v = -std::numeric_limits<float>::infinity();
    bool finite = true;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = lo + j;
      float m, v;
      if constexpr (kFp8) {
        m = fp8_value<kE4M3>(a.m[i]) * scale_m;
        const float s = fp8_value<FV>(a.v[i]) * scale_v;
        v = s * s;
      } else {
        m = a.map_m.q[a.m[i]] * scale_m;
        v = a.map_v.q[a.v[i]] * scale_v;
      }
      if (a.guard_lost_v && v == 0.0f && m != 0.0f) v = m * m;  // the lost-v guard
      const float w = adam_update(a, to_float(grad[i]), &m, &v, to_float(var[i]));
      finite = finite && adam_produced_finite<T>(m, v, w);
      if constexpr (kFp8) v = std::sqrt(v);  // what the update divided by; what is stored
      m_new[j] = m;
      v_new[j] = v;
      w_new[j] = w;
      max_m = std::max(max_m, std::fabs(m));
      max_v = std::max(max_v, v);
    }
    if (!finite) {
      ++skipped;
      continue;
    }
    for (int64_t j = 0; j < len; ++j) var[lo + j] = from_float<T>(w_new[j]);
    max_m = max_m + 0.0f;  // -0 becomes +0
    max_v = max_v + 0.0f;
    if constexpr (kFp8) {
      const Fp8BlockScale sm = fp8_block_scale<kE4M3>(max_m);
      const Fp8BlockScale sv = fp8_block_scale<FV>(max_v);
      *absmax_m = sm.scale;
      *absmax_v = sv.scale;
      for (int64_t j = 0; j < len; ++j) {
        a.m[lo + j] = fp8_block_code<kE4M3>(m_new[j], sm);
        a.v[lo + j] = fp8_block_code<FV>(v_new[j], sv);
      }
      continue;
    }
    *absmax_m = max_m;
    *absmax_v = max_v;
    const float div_m = max_m == 0.0f ? 1.0f : max_m;
    const float div_v = max_v == 0.0f ? 1.0f : max_v;
    for (int64_t j = 0; j < len; ++j) {
      a.m[lo + j] = quant_code_reference(a.map_m, m_new[j] / div_m);
      a.v[lo + j] = quant_code_reference(a.map_v, v_new[j] / div_v);
    }
  }
  return skipped;
}

}  // namespace

int64_t adam_w_quant_blocks_reference(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype, [&]<class T>() { return quant_blocks<T, false>(a, begin, end); });
}

int64_t adam_w_quant_fp8_blocks_reference(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype,
                         [&]<class T>() { return quant_blocks<T, true, kUE4M4>(a, begin, end); });
}

int64_t adam_w_quant_fp8_ue3m5_blocks_reference(const AdamWQuantArgs &a, int64_t begin,
                                                int64_t end) {
  return with_float_type(a.dtype,
                         [&]<class T>() { return quant_blocks<T, true, kUE3M5>(a, begin, end); });
}

}  // namespace fusekit
