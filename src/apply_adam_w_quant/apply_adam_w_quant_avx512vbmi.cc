// ApplyAdamWQuant, the cpu_avx512vbmi implementation's kernel: AVX-512 with VBMI (Zen 4, Ice Lake
// and later). Nothing is gathered: the maps and the search tables are held in registers (byte-plane
// permutes for the map lookups, an in-register binary search for the codes), which is 1.8x faster
// on Zen 4, where gathers cost about one cycle per lane. Bitwise the results of the other kernels.
//
// A single-ISA source, compiled once with its own flags (fusekit_avx512vbmi_sources in
// CMakeLists.txt: Highway's static target AVX3, no per-target passes), with VBMI added to its
// functions' target attributes; the implementation list runs it only where the CPU has AVX-512 F,
// BW, DQ, VL and VBMI (adam_w_quant_avx512vbmi_why_not). The byte planes, the in-register searches
// and the register tables are common/avx512/quant_codes_avx512vbmi.h (shared with LazyAdamQuant).
// A partial last block, and m's sign fix on maps whose thresholds share buckets, run the generic
// kernel's code (apply_adam_w_quant_hwy-inl.h, common/quant_codes_hwy-inl.h) for the same target.
#include <hwy/highway.h>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/quant_search.h"

#if HWY_ARCH_X86
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "apply_adam_w_quant/apply_adam_w_quant_hwy-inl.h"
#include "common/avx512/quant_codes_avx512vbmi.h"
#include "fusekit/float16.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

// kCodes: the mode (each its own instantiation: a branch for an unused step made GCC allocate the
// hot loops worse).
template <typename T, int kCodes>
FUSEKIT_QUANT_VBMI HWY_NOINLINE int64_t FastBlocks(const AdamWQuantArgs &a, const VbmiTables &pt,
                                                   int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  // The register tables, copied from the run's prepared tables into locals (the kernel's stores
  // through byte pointers cannot alias them, so loads of them stay hoisted).
  const BytePlanes pm = pt.pm, pv = pt.pv;
  SearchTables search_m, search_v;
  Search16Tables s16_m, s16_v;
  if constexpr (kCodes > 0) {
    s16_m = pt.s16_m;
    s16_v = pt.s16_v;
  } else {
    search_m = pt.search_m;
    search_v = pt.search_v;
  }
  const AdamVectors<decltype(df)> adam(df, a);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i var_limit = _mm512_set1_epi32(static_cast<int32_t>(adam_stored_finite_limit<T>()));
  alignas(64) float m_new[kBlock];
  alignas(64) float v_new[kBlock];
  alignas(64) float w_new[kBlock];
  int64_t skipped = 0;
  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock;
    if (lo + kBlock > a.n) {
      skipped += QuantBlocks<T>(a, b, b + 1);
      continue;
    }
    // The update into the buffers, nothing stored; then the guard (GuardedBlock, as the generic
    // kernel: var's largest magnitude bits and the two maxima).
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const __m512 vscale_m = _mm512_set1_ps(*absmax_m), vscale_v = _mm512_set1_ps(*absmax_v);
    __m512 acc_m = _mm512_setzero_ps();
    __m512 acc_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512i acc_w = _mm512_setzero_si512();
    for (int64_t j0 = 0; j0 < kBlock; j0 += 64) {
      __m512 qm[4], qv[4];
      Dequant64(pm, _mm512_loadu_si512(a.m + lo + j0), qm);
      Dequant64(pv, _mm512_loadu_si512(a.v + lo + j0), qv);
      for (int k = 0; k < 4; ++k) {
        const int64_t j = j0 + 16 * k, i = lo + j;
        hn::Vec512<float> m{_mm512_mul_ps(qm[k], vscale_m)}, v{_mm512_mul_ps(qv[k], vscale_v)};
        if (a.guard_lost_v) v = GuardLostV(m, v);
        const hn::Vec512<float> w =
            adam.Update(LoadWide(df, grad + i), m, v, LoadWide(df, var + i));
        _mm512_store_ps(w_new + j, w.raw);
        _mm512_store_ps(m_new + j, m.raw);
        _mm512_store_ps(v_new + j, v.raw);
        acc_m = _mm512_max_ps(_mm512_abs_ps(m.raw), acc_m);
        acc_v = _mm512_max_ps(v.raw, acc_v);
        acc_w = _mm512_max_epi32(acc_w, _mm512_and_si512(_mm512_castps_si512(w.raw), magnitude));
      }
    }
    float max_m = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_m}));
    float max_v = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_v}));
    if (!GuardedBlock(_mm512_cmpge_epi32_mask(acc_w, var_limit) == 0, max_m, max_v)) {
      ++skipped;
      continue;
    }
    for (int64_t j = 0; j < kBlock; j += 16)
      StoreNarrow(df, hn::Vec512<float>{_mm512_load_ps(w_new + j)}, var + lo + j);
    max_m = max_m + 0.0f;
    max_v = max_v + 0.0f;
    *absmax_m = max_m;
    *absmax_v = max_v;
    const float div_m = max_m == 0.0f ? 1.0f : max_m;
    const float div_v = max_v == 0.0f ? 1.0f : max_v;
    const __m512 vdiv_m = _mm512_set1_ps(div_m), vdiv_v = _mm512_set1_ps(div_v);
    if (kCodes > 0) {
      BlockCodes16<kCodes == 2>(s16_m, s16_v, m_new, v_new, vdiv_m, vdiv_v, a.m + lo, a.v + lo);
    } else {
      BlockCodes2(df, a.map_m, search_m, search_v, m_new, v_new, vdiv_m, vdiv_v, a.m + lo,
                  a.v + lo);
    }
  }
  return skipped;
}

template <typename T>
int64_t BlocksOf(const AdamWQuantArgs &a, const VbmiTables &t, int64_t begin, int64_t end) {
  switch (t.mode) {
    case 2:
      return FastBlocks<T, 2>(a, t, begin, end);
    case 1:
      return FastBlocks<T, 1>(a, t, begin, end);
    default:
      return FastBlocks<T, 0>(a, t, begin, end);
  }
}

int64_t AdamWQuantBlocksVbmi(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  if (a.prepared == nullptr) {  // not prepared by the run: the tables of this call only
    alignas(64) unsigned char local[kAdamWQuantPreparedBytes];
    PrepareTables(a.map_m, a.map_v, local);
    AdamWQuantArgs b = a;
    b.prepared = local;
    return AdamWQuantBlocksVbmi(b, begin, end);
  }
  const auto &t = *static_cast<const VbmiTables *>(a.prepared);
  switch (a.dtype) {
    case DType::kFloat16:
      return BlocksOf<float16_t>(a, t, begin, end);
    case DType::kBFloat16:
      return BlocksOf<bfloat16_t>(a, t, begin, end);
    default:
      return BlocksOf<float>(a, t, begin, end);
  }
}

void PrepareVbmi(const QuantMapTables &m, const QuantMapTables &v, void *out) {
  PrepareTables(m, v, out);
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // HWY_ARCH_X86

fusekit::QuantVbmiKernel<fusekit::AdamWQuantBlocksFn> fusekit::adam_w_quant_avx512vbmi() {
#if HWY_ARCH_X86
  return {&HWY_NAMESPACE::AdamWQuantBlocksVbmi, &HWY_NAMESPACE::PrepareVbmi};
#else
  return {};
#endif
}
