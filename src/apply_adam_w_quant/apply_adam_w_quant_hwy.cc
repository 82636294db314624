// ApplyAdamWQuant and AdamW, the optimized kernels: Highway SIMD within a block of 256 elements,
// compiled for every x86 target Highway builds and dispatched at run time. The same float32
// operations in the same order as the reference kernel (no FMA), so results are bitwise equal.
//
// Per block: (1) a finite check of the gradient; (2) dequantize (a gather from the 256-float map),
// the Adam update, var stored, the new m and v kept in two 1 KiB buffers, their block maxima;
// (3) requantize: the nearest code by a table lookup over the normalized value's float bits and
// one or two comparisons with the decision thresholds (or, without the table, 8 branch-free steps).
// On AVX-512 with VBMI (FastBlocks below) nothing is gathered: the maps and the search tables are
// held in registers (byte-plane permutes for the map lookups, an in-register binary search for the
// codes), which is 1.8x faster on Zen 4, where gathers cost about one cycle per lane.
//
// The 16-bit stores round to nearest-even in integer arithmetic (bfloat16) or with F16C (float16 on
// AVX2 and up); Highway 1.0.3's own bfloat16 demotion truncates, and its float16 emulation below
// AVX2 does too, so neither is used.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "apply_adam_w_quant/apply_adam_w_quant_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "fusekit/float16.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {  // internal linkage: no clash with other operators' kernels of the same names

#undef FUSEKIT_AWQ_HW_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define FUSEKIT_AWQ_HW_F16 1
#else
#define FUSEKIT_AWQ_HW_F16 0
#endif

constexpr int64_t kBlock = 256;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// ---- widening loads and rounding stores ------------------------------------------------------
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const float *p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const bfloat16_t *p) {
  const hn::Rebind<hwy::bfloat16_t, DF> db;
  return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t *>(p)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const float16_t *p) {
#if FUSEKIT_AWQ_HW_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t *>(p)));
#else
  HWY_ALIGN float tmp[kMaxLanes];
  for (size_t i = 0; i < hn::Lanes(df); ++i) tmp[i] = half_bits_to_float(p[i].bits);
  return hn::Load(df, tmp);
#endif
}

template <class DF>
HWY_INLINE void StoreNarrow(DF df, hn::Vec<DF> w, float *p) {
  hn::StoreU(w, df, p);
}
template <class DF>
HWY_INLINE void StoreNarrow(DF /* df */, hn::Vec<DF> w, bfloat16_t *p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const auto bits = hn::BitCast(du, w);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet_nan = hn::ShiftRight<16>(hn::Or(bits, hn::Set(du, 0x00400000u)));
  const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(w)), quiet_nan, rounded);
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, r)), d16, reinterpret_cast<uint16_t *>(p));
}
template <class DF>
HWY_INLINE void StoreNarrow(DF df, hn::Vec<DF> w, float16_t *p) {
#if FUSEKIT_AWQ_HW_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::StoreU(hn::DemoteTo(dh, w), dh, reinterpret_cast<hwy::float16_t *>(p));
#else
  HWY_ALIGN float tmp[kMaxLanes];
  hn::Store(w, df, tmp);
  for (size_t i = 0; i < hn::Lanes(df); ++i) p[i].bits = float_to_half_bits(tmp[i]);
#endif
}

// ---- the Adam update on vectors: adam_update() of the kernels header, operation for operation --
template <class DF>
struct AdamVectors {
  hn::Vec<DF> b1, b2, omb1, omb2, gs, step, eps, decay;
  bool apply_decay;
  AdamVectors(DF df, const AdamScalars &s)
      : b1(hn::Set(df, s.beta1)),
        b2(hn::Set(df, s.beta2)),
        omb1(hn::Set(df, s.one_minus_beta1)),
        omb2(hn::Set(df, s.one_minus_beta2)),
        gs(hn::Set(df, s.gnorm_scale)),
        step(hn::Set(df, s.step_size)),
        eps(hn::Set(df, s.eps_c2s)),
        decay(hn::Set(df, s.decay)),
        apply_decay(s.apply_decay) {}
  // m and v updated in place; returns the new var.
  HWY_INLINE hn::Vec<DF> Update(hn::Vec<DF> grad, hn::Vec<DF> &m, hn::Vec<DF> &v,
                                hn::Vec<DF> w) const {
    const auto g = hn::Mul(grad, gs);
    m = hn::Add(hn::Mul(m, b1), hn::Mul(g, omb1));
    v = hn::Add(hn::Mul(v, b2), hn::Mul(hn::Mul(g, g), omb2));
    w = hn::Add(w, hn::Div(hn::Mul(m, step), hn::Add(hn::Sqrt(v), eps)));
    return apply_decay ? hn::Mul(w, decay) : w;
  }
};

// ---- the nearest code ------------------------------------------------------------------------
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Codes(DF df, const QuantMapTables &t, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  x = hn::IfThenZeroElse(hn::IsNaN(x), x);
  if (t.packed != nullptr) {
    // One lookup: the bucket's codes below and above its threshold, and the threshold's low bits.
    x = hn::Add(x, hn::Zero(df));  // -0 becomes +0
    const auto bits = hn::BitCast(du, x);
    const auto flip =
        hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
    const auto key = hn::Xor(bits, flip);
    const auto e = hn::GatherIndex(di, reinterpret_cast<const int32_t *>(t.packed),
                                   hn::BitCast(di, hn::ShiftRight<16>(key)));
    const auto low = hn::BitCast(di, hn::And(key, hn::Set(du, 0xffffu)));
    const auto thr_low = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, e)));
    const auto ff = hn::Set(di, 0xff);
    return hn::IfThenElse(hn::Lt(low, thr_low), hn::And(e, ff), hn::And(hn::ShiftRight<8>(e), ff));
  }
  hn::Vec<decltype(di)> c;
  if (t.lut != nullptr) {
    const auto bits = hn::BitCast(du, x);
    const auto flip =
        hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
    const auto bucket = hn::ShiftRight<16>(hn::Xor(bits, flip));
    c = hn::And(
        hn::GatherOffset(di, reinterpret_cast<const int32_t *>(t.lut), hn::BitCast(di, bucket)),
        hn::Set(di, 0xff));
    for (int s = 0; s < t.refine_steps; ++s) {
      const auto th = hn::GatherIndex(df, t.thr, c);
      c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, hn::Ge(x, th))));
    }
  } else {
    c = hn::Zero(di);
    for (int step = 128; step > 0; step >>= 1) {
      const auto cand = hn::Add(c, hn::Set(di, step));
      const auto th = hn::GatherIndex(df, t.thr, hn::Sub(cand, hn::Set(di, 1)));
      c = hn::IfThenElse(hn::RebindMask(di, hn::Ge(x, th)), cand, c);
    }
  }
  auto code = t.identity_first ? c : hn::GatherIndex(di, t.first, c);
  if (t.sign_fix) {
    const auto zero = hn::Zero(df);
    const auto qc = hn::GatherIndex(df, t.q, code);
    const auto need = hn::RebindMask(di, hn::Lt(hn::Mul(x, qc), zero));
    const auto dir =
        hn::IfThenElse(hn::RebindMask(di, hn::Gt(x, zero)), hn::Set(di, 1), hn::Set(di, -1));
    const auto moved = hn::Min(hn::Max(hn::Add(code, dir), hn::Zero(di)), hn::Set(di, 255));
    code = hn::IfThenElse(need, moved, code);
  }
  return code;
}

// The packed-table code of x' = m * (1 / absmax), and the lanes where x' may sit on the other side
// of a threshold or bucket edge than x = m / absmax would: x' is within 3 units in the last place
// of x (two float32 roundings and the reciprocal's), so a lane whose key is more than kMargin
// keys from its bucket's threshold and edges has x's code. The caller redoes unsure vectors
// exactly with the division.
constexpr int32_t kMargin = 8;
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> PackedCodesApprox(
    DF df, const uint32_t *packed, hn::Vec<DF> x, hn::Mask<hn::RebindToSigned<DF>> *unsure) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  x = hn::Add(hn::IfThenZeroElse(hn::IsNaN(x), x), hn::Zero(df));
  const auto bits = hn::BitCast(du, x);
  const auto flip =
      hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
  const auto key = hn::Xor(bits, flip);
  const auto e = hn::GatherIndex(di, reinterpret_cast<const int32_t *>(packed),
                                 hn::BitCast(di, hn::ShiftRight<16>(key)));
  const auto low = hn::BitCast(di, hn::And(key, hn::Set(du, 0xffffu)));
  const auto thr_low = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, e)));
  const auto ff = hn::Set(di, 0xff);
  *unsure = hn::Or(hn::Lt(hn::Abs(hn::Sub(low, thr_low)), hn::Set(di, kMargin + 1)),
                   hn::Or(hn::Lt(low, hn::Set(di, kMargin + 1)),
                          hn::Gt(low, hn::Set(di, 0xffff - kMargin - 1))));
  return hn::IfThenElse(hn::Lt(low, thr_low), hn::And(e, ff), hn::And(hn::ShiftRight<8>(e), ff));
}

// A block's codes for one map: by reciprocal when the table is packed and 1 / absmax is a normal
// float (checked lanes redone exactly), else by division.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> BlockCodes(DF df, const QuantMapTables &t, hn::Vec<DF> m,
                                                      hn::Vec<DF> vdiv, bool use_recip,
                                                      hn::Vec<DF> vrecip) {
  const hn::RebindToSigned<DF> di;
  if (use_recip) {
    hn::Mask<decltype(di)> unsure;
    const auto c = PackedCodesApprox(df, t.packed, hn::Mul(m, vrecip), &unsure);
    if (HWY_LIKELY(hn::AllFalse(di, unsure))) return c;
  }
  return Codes(df, t, hn::Div(m, vdiv));
}

inline bool recip_ok(const QuantMapTables &t, float div) {
  return t.packed != nullptr && div >= 0x1p-126f && div <= 0x1p126f;
}

template <typename T>
int64_t QuantBlocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  const auto zero = hn::Zero(df);
  const AdamVectors<decltype(df)> adam(df, a);
  HWY_ALIGN float m_new[kBlock];
  HWY_ALIGN float v_new[kBlock];
  int64_t skipped = 0;

  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, a.n - lo);
    const int64_t vec_len = len / N * N;
    // (1) Finite check: g * 0 is 0 for finite g and NaN for Inf or NaN.
    auto acc = zero;
    for (int64_t j = 0; j < vec_len; j += N)
      acc = hn::Add(acc, hn::Mul(LoadWide(df, grad + lo + j), zero));
    bool finite = hn::AllTrue(df, hn::Eq(acc, zero));
    for (int64_t j = vec_len; j < len; ++j)
      finite = finite && std::isfinite(to_float(grad[lo + j]));
    if (!finite) {
      ++skipped;
      continue;
    }
    // (2) The Adam update.
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const float scale_m = *absmax_m, scale_v = *absmax_v;
    const auto vscale_m = hn::Set(df, scale_m), vscale_v = hn::Set(df, scale_v);
    auto acc_m = zero, acc_v = hn::Set(df, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < vec_len; j += N) {
      const int64_t i = lo + j;
      const auto mc = hn::PromoteTo(di, hn::LoadU(d8, a.m + i));
      const auto vc = hn::PromoteTo(di, hn::LoadU(d8, a.v + i));
      auto m = hn::Mul(hn::GatherIndex(df, a.map_m.q, mc), vscale_m);
      auto v = hn::Mul(hn::GatherIndex(df, a.map_v.q, vc), vscale_v);
      StoreNarrow(df, adam.Update(LoadWide(df, grad + i), m, v, LoadWide(df, var + i)), var + i);
      hn::Store(m, df, m_new + j);
      hn::Store(v, df, v_new + j);
      acc_m = hn::Max(hn::Abs(m), acc_m);
      acc_v = hn::Max(v, acc_v);
    }
    float max_m = hn::GetLane(hn::MaxOfLanes(df, acc_m));
    float max_v = hn::GetLane(hn::MaxOfLanes(df, acc_v));
    for (int64_t j = vec_len; j < len; ++j) {
      const int64_t i = lo + j;
      float m = a.map_m.q[a.m[i]] * scale_m;
      float v = a.map_v.q[a.v[i]] * scale_v;
      var[i] = from_float<T>(adam_update(a, to_float(grad[i]), &m, &v, to_float(var[i])));
      m_new[j] = m;
      v_new[j] = v;
      max_m = std::max(max_m, std::fabs(m));
      max_v = std::max(max_v, v);
    }
    max_m = max_m + 0.0f;
    max_v = max_v + 0.0f;
    *absmax_m = max_m;
    *absmax_v = max_v;
    // (3) Requantize.
    const float div_m = max_m == 0.0f ? 1.0f : max_m;
    const float div_v = max_v == 0.0f ? 1.0f : max_v;
    const auto vdiv_m = hn::Set(df, div_m), vdiv_v = hn::Set(df, div_v);
    const bool recip_m = recip_ok(a.map_m, div_m), recip_v = recip_ok(a.map_v, div_v);
    const auto vrecip_m = hn::Set(df, 1.0f / div_m), vrecip_v = hn::Set(df, 1.0f / div_v);
    for (int64_t j = 0; j < vec_len; j += N) {
      const auto cm = BlockCodes(df, a.map_m, hn::Load(df, m_new + j), vdiv_m, recip_m, vrecip_m);
      const auto cv = BlockCodes(df, a.map_v, hn::Load(df, v_new + j), vdiv_v, recip_v, vrecip_v);
      hn::StoreU(hn::DemoteTo(d8, cm), d8, a.m + lo + j);
      hn::StoreU(hn::DemoteTo(d8, cv), d8, a.v + lo + j);
    }
    for (int64_t j = vec_len; j < len; ++j) {
      a.m[lo + j] = quant_code_reference(a.map_m, m_new[j] / div_m);
      a.v[lo + j] = quant_code_reference(a.map_v, v_new[j] / div_v);
    }
  }
  return skipped;
}

// ---- AVX-512 with VBMI: no gathers for the dequantization ------------------------------------
// The two 256-float maps are split into four byte planes each (byte p of every entry's bits: 256
// bytes, four registers); one code vector of 64 bytes is looked up in each plane with two
// two-register byte permutes (`vpermt2b`, 7-bit index) and a blend on the code's top bit, and the
// four planes are interleaved back into floats with unpacks. The unpacks interleave within 128-bit
// lanes, so the codes are first permuted (a 4x4 transpose of their dwords) to make the floats come
// out in element order. Full blocks only; a partial last block runs the generic kernel.
#undef FUSEKIT_AWQ_FAST
#undef FUSEKIT_AWQ_VBMI
#if (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && HWY_ARCH_X86
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*(), which -Wmaybe-uninitialized
// flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define FUSEKIT_AWQ_FAST 1
#define FUSEKIT_AWQ_VBMI __attribute__((target(HWY_TARGET_STR ",avx512vbmi")))

struct BytePlanes {
  __m512i lo[4][2];  // plane p, entries 0..63 and 64..127
  __m512i hi[4][2];  // entries 128..191 and 192..255
};

FUSEKIT_AWQ_VBMI inline void MakePlanes(const float *q, BytePlanes *bp) {
  alignas(64) uint8_t bytes[4][256];
  for (int i = 0; i < 256; ++i) {
    uint32_t bits;
    std::memcpy(&bits, q + i, 4);
    for (int p = 0; p < 4; ++p) bytes[p][i] = static_cast<uint8_t>(bits >> (8 * p));
  }
  for (int p = 0; p < 4; ++p) {
    bp->lo[p][0] = _mm512_load_si512(bytes[p]);
    bp->lo[p][1] = _mm512_load_si512(bytes[p] + 64);
    bp->hi[p][0] = _mm512_load_si512(bytes[p] + 128);
    bp->hi[p][1] = _mm512_load_si512(bytes[p] + 192);
  }
}

// q[code] for 64 codes, as four vectors of 16 floats in element order.
FUSEKIT_AWQ_VBMI HWY_INLINE void Dequant64(const BytePlanes &bp, __m512i codes, __m512 out[4]) {
  const __m512i c = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), codes);
  const __mmask64 top = _mm512_movepi8_mask(c);
  __m512i p[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i l = _mm512_permutex2var_epi8(bp.lo[k][0], c, bp.lo[k][1]);
    const __m512i h = _mm512_permutex2var_epi8(bp.hi[k][0], c, bp.hi[k][1]);
    p[k] = _mm512_mask_blend_epi8(top, l, h);
  }
  const __m512i lo01 = _mm512_unpacklo_epi8(p[0], p[1]), hi01 = _mm512_unpackhi_epi8(p[0], p[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(p[2], p[3]), hi23 = _mm512_unpackhi_epi8(p[2], p[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23));
}

// True when a full block's gradient is finite (on the storage bits: exponent not all ones).
FUSEKIT_AWQ_VBMI HWY_INLINE bool BlockFinite(const float *g) {
  __m512i acc = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (int j = 0; j < kBlock; j += 16)
    acc = _mm512_max_epu32(acc, _mm512_and_si512(_mm512_loadu_si512(g + j), abs_mask));
  return _mm512_cmpge_epu32_mask(acc, _mm512_set1_epi32(0x7f800000)) == 0;
}
FUSEKIT_AWQ_VBMI HWY_INLINE bool Finite16(const void *g, int exp_all_ones) {
  __m512i acc = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi16(0x7fff);
  const auto *p = static_cast<const uint16_t *>(g);
  for (int j = 0; j < kBlock; j += 32)
    acc = _mm512_max_epu16(acc, _mm512_and_si512(_mm512_loadu_si512(p + j), abs_mask));
  return _mm512_cmpge_epu16_mask(acc, _mm512_set1_epi16(static_cast<int16_t>(exp_all_ones))) == 0;
}
FUSEKIT_AWQ_VBMI HWY_INLINE bool BlockFinite(const bfloat16_t *g) {
  return Finite16(g, 0x7f80);
}
FUSEKIT_AWQ_VBMI HWY_INLINE bool BlockFinite(const float16_t *g) {
  return Finite16(g, 0x7c00);
}

// The count of thresholds <= x by an 8-level branch-free binary search with the thresholds held in
// registers. The path is kept bit-reversed (level l's outcome in bit l - 1), so that it indexes the
// next level's table directly: level l's table lists, for each path r of l - 1 bits, the threshold
// that search compares next (levels 2-5: one 16-float register, one permute; level 6: two
// registers; 7 and 8: four and eight registers, two and four permutes and blends on the outcomes of
// levels 6 and 7, which are bits 5 and 6 of the path). After 8 levels the path is the count
// bit-reversed; a byte table maps it to the code (first[count]). NaN thresholds (past the distinct
// values) fail every comparison, as in the reference search.
struct SearchTables {
  float t1;
  __m512 t2, t3, t4, t5, t6[2], t7[4], t8[8];
  __m512i code[4];  // code of path r (bytes), r = 0..255
};

inline int BitReverse8(int r) {
  int c = 0;
  for (int l = 0; l < 8; ++l) c |= ((r >> l) & 1) << (7 - l);
  return c;
}

FUSEKIT_AWQ_VBMI inline void MakeSearch(const QuantMapTables &t, SearchTables *s) {
  alignas(64) float lv[9][128];
  for (int l = 1; l <= 8; ++l) {
    for (int r = 0; r < 128; ++r) {
      float th = 0.0f;
      if (r < (1 << (l - 1))) {
        int c =
            0;  // the count so far: bit l' - 1 of r is the outcome of level l' (weight 2^(8 - l'))
        for (int k = 1; k < l; ++k) c += ((r >> (k - 1)) & 1) << (8 - k);
        th = t.thr[c + (1 << (8 - l)) - 1];
      }
      lv[l][r] = th;
    }
  }
  s->t1 = lv[1][0];
  s->t2 = _mm512_load_ps(lv[2]);
  s->t3 = _mm512_load_ps(lv[3]);
  s->t4 = _mm512_load_ps(lv[4]);
  s->t5 = _mm512_load_ps(lv[5]);
  for (int k = 0; k < 2; ++k) s->t6[k] = _mm512_load_ps(lv[6] + 16 * k);
  for (int k = 0; k < 4; ++k) s->t7[k] = _mm512_load_ps(lv[7] + 16 * k);
  for (int k = 0; k < 8; ++k) s->t8[k] = _mm512_load_ps(lv[8] + 16 * k);
  alignas(64) uint8_t code[256];
  for (int r = 0; r < 256; ++r) code[r] = static_cast<uint8_t>(t.first[BitReverse8(r)]);
  for (int k = 0; k < 4; ++k) s->code[k] = _mm512_load_si512(code + 64 * k);
}

// Bit-reversed counts of NV x 16 values (NaN taken as 0), vector j searched in *s[j]. The levels
// are a chain of dependent permutes and comparisons, so many independent vectors go through each
// level together.
template <int NV>
FUSEKIT_AWQ_VBMI HWY_INLINE void SearchN(const SearchTables *const s[NV], const __m512 xin[NV],
                                         __m512i r[NV]) {
  __m512 x[NV];
  __mmask16 k6[NV], k7[NV];
  for (int j = 0; j < NV; ++j) {
    x[j] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(xin[j], xin[j], _CMP_ORD_Q), xin[j]);
    r[j] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(x[j], _mm512_set1_ps(s[j]->t1), _CMP_GE_OQ),
                                  _mm512_set1_epi32(1));
  }
#define FUSEKIT_AWQ_LEVEL(T, BIT)                                                   \
  for (int j = 0; j < NV; ++j) {                                                    \
    const __mmask16 k =                                                             \
        _mm512_cmp_ps_mask(x[j], _mm512_permutexvar_ps(r[j], s[j]->T), _CMP_GE_OQ); \
    r[j] = _mm512_mask_or_epi32(r[j], k, r[j], _mm512_set1_epi32(BIT));             \
  }
  FUSEKIT_AWQ_LEVEL(t2, 2)
  FUSEKIT_AWQ_LEVEL(t3, 4)
  FUSEKIT_AWQ_LEVEL(t4, 8)
  FUSEKIT_AWQ_LEVEL(t5, 16)
#undef FUSEKIT_AWQ_LEVEL
  for (int j = 0; j < NV; ++j) {
    k6[j] = _mm512_cmp_ps_mask(x[j], _mm512_permutex2var_ps(s[j]->t6[0], r[j], s[j]->t6[1]),
                               _CMP_GE_OQ);
    r[j] = _mm512_mask_or_epi32(r[j], k6[j], r[j], _mm512_set1_epi32(32));
  }
  for (int j = 0; j < NV; ++j) {
    const __m512 a = _mm512_permutex2var_ps(s[j]->t7[0], r[j], s[j]->t7[1]);
    const __m512 b = _mm512_permutex2var_ps(s[j]->t7[2], r[j], s[j]->t7[3]);
    k7[j] = _mm512_cmp_ps_mask(x[j], _mm512_mask_blend_ps(k6[j], a, b), _CMP_GE_OQ);
    r[j] = _mm512_mask_or_epi32(r[j], k7[j], r[j], _mm512_set1_epi32(64));
  }
  for (int j = 0; j < NV; ++j) {
    const __m512 a = _mm512_permutex2var_ps(s[j]->t8[0], r[j], s[j]->t8[1]);
    const __m512 b = _mm512_permutex2var_ps(s[j]->t8[2], r[j], s[j]->t8[3]);
    const __m512 c = _mm512_permutex2var_ps(s[j]->t8[4], r[j], s[j]->t8[5]);
    const __m512 d = _mm512_permutex2var_ps(s[j]->t8[6], r[j], s[j]->t8[7]);
    const __m512 th = _mm512_mask_blend_ps(k7[j], _mm512_mask_blend_ps(k6[j], a, b),
                                           _mm512_mask_blend_ps(k6[j], c, d));
    const __mmask16 k = _mm512_cmp_ps_mask(x[j], th, _CMP_GE_OQ);
    r[j] = _mm512_mask_or_epi32(r[j], k, r[j], _mm512_set1_epi32(128));
  }
}

// 4 x 16 bit-reversed counts (0..255) to 64 code bytes in element order.
FUSEKIT_AWQ_VBMI HWY_INLINE __m512i PathsToCodes(const SearchTables &s, const __m512i r[4]) {
  const __m512i p01 = _mm512_packus_epi32(r[0], r[1]), p23 = _mm512_packus_epi32(r[2], r[3]);
  const __m512i b = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
      _mm512_packus_epi16(p01, p23));
  const __m512i lo = _mm512_permutex2var_epi8(s.code[0], b, s.code[1]);
  const __m512i hi = _mm512_permutex2var_epi8(s.code[2], b, s.code[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(b), lo, hi);
}

// A full block's codes of x = moment / div for both maps: the in-register search, both maps'
// vectors together; a map where the sign fix can act takes the generic search per vector.
template <class DF>
FUSEKIT_AWQ_VBMI HWY_INLINE void GenericCodes(DF df, const QuantMapTables &t, const float *mom,
                                              __m512 vdiv, uint8_t *out) {
  for (int j = 0; j < kBlock; j += 16) {
    const __m512i c =
        Codes(df, t, hn::Vec512<float>{_mm512_div_ps(_mm512_load_ps(mom + j), vdiv)}).raw;
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out + j), _mm512_cvtepi32_epi8(c));
  }
}

template <class DF>
FUSEKIT_AWQ_VBMI HWY_INLINE void BlockCodes2(DF df, const AdamWQuantArgs &a, const SearchTables &sm,
                                             const SearchTables &sv, const float *m_new,
                                             const float *v_new, __m512 vdiv_m, __m512 vdiv_v,
                                             int64_t lo) {
  if (a.map_m.sign_fix) {
    GenericCodes(df, a.map_m, m_new, vdiv_m, a.m + lo);
    for (int j0 = 0; j0 < kBlock; j0 += 64) {
      const SearchTables *s[4] = {&sv, &sv, &sv, &sv};
      __m512 x[4];
      __m512i r[4];
      for (int k = 0; k < 4; ++k) x[k] = _mm512_div_ps(_mm512_load_ps(v_new + j0 + 16 * k), vdiv_v);
      SearchN<4>(s, x, r);
      _mm512_storeu_si512(a.v + lo + j0, PathsToCodes(sv, r));
    }
    return;
  }
  for (int j0 = 0; j0 < kBlock; j0 += 64) {
    const SearchTables *s[8] = {&sm, &sm, &sm, &sm, &sv, &sv, &sv, &sv};
    __m512 x[8];
    __m512i r[8];
    for (int k = 0; k < 4; ++k) {
      x[k] = _mm512_div_ps(_mm512_load_ps(m_new + j0 + 16 * k), vdiv_m);
      x[4 + k] = _mm512_div_ps(_mm512_load_ps(v_new + j0 + 16 * k), vdiv_v);
    }
    SearchN<8>(s, x, r);
    _mm512_storeu_si512(a.m + lo + j0, PathsToCodes(sm, r));
    _mm512_storeu_si512(a.v + lo + j0, PathsToCodes(sv, r + 4));
  }
}

// ---- the nearest code by a 16-bit search (maps whose thresholds lie in distinct buckets) --------
// When no two thresholds share the top 16 bits of their monotone key (the condition of the packed
// table: it holds for the dynamic and linspace maps), the count of thresholds <= x is
//   c0 + [x >= thr[c0]],   c0 = #{k : hi16(key(thr[k])) < hi16(key(x))}
// (thresholds below c0 lie in lower buckets, so below x; those above c0 in higher buckets, so above
// x; only thr[c0] can share x's bucket and is compared in full). c0 is found by the same
// bit-reversed binary search as above on 16-bit lanes, 32 values per vector, and thr[c0] is fetched
// from byte planes like the dequantization; -0 is taken as +0 (keys and the comparison agree then).
struct Search16Tables {
  __m512i t1;                                // level 1, broadcast
  __m512i t2, t3, t4, t5, t6, t7[2], t8[4];  // 16-bit entries by bit-reversed path
  BytePlanes thr;                            // thr[bitrev(r)] by path r (NaN past the thresholds)
  BytePlanes q;                              // the map by code (for the sign fix)
  bool sign_fix;
  __m512i code0[4], code1[4];  // first[bitrev(r)], first[bitrev(r) + 1]
};

inline uint32_t BucketKey(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t key = float_key(bits);
  return key == 0x7fffffffu ? 0x80000000u : key;  // -0 as +0
}

// Whether no two thresholds share a bucket (the 16-bit search applies).
inline bool DistinctBuckets(const QuantMapTables &t) {
  for (int k = 1; k < t.distinct - 1; ++k) {
    if ((BucketKey(t.thr[k]) >> 16) == (BucketKey(t.thr[k - 1]) >> 16)) return false;
  }
  return true;
}

// False when two thresholds share a bucket (then the 32-bit search runs).
FUSEKIT_AWQ_VBMI inline bool MakeSearch16(const QuantMapTables &t, Search16Tables *s) {
  const int d = t.distinct - 1;  // real thresholds
  alignas(64) uint16_t h[256];
  for (int k = 0; k < 256; ++k)
    h[k] = k < d ? static_cast<uint16_t>(BucketKey(t.thr[k]) >> 16) : 0xffff;
  for (int k = 1; k < d; ++k) {
    if (h[k] == h[k - 1]) return false;
  }
  alignas(64) uint16_t lv[9][128];
  for (int l = 1; l <= 8; ++l) {
    for (int r = 0; r < 128; ++r) {
      uint16_t th = 0xffff;
      if (r < (1 << (l - 1))) {
        int c = 0;
        for (int k = 1; k < l; ++k) c += ((r >> (k - 1)) & 1) << (8 - k);
        th = h[c + (1 << (8 - l)) - 1];
      }
      lv[l][r] = th;
    }
  }
  s->t1 = _mm512_set1_epi16(static_cast<int16_t>(lv[1][0]));
  s->t2 = _mm512_load_si512(lv[2]);
  s->t3 = _mm512_load_si512(lv[3]);
  s->t4 = _mm512_load_si512(lv[4]);
  s->t5 = _mm512_load_si512(lv[5]);
  s->t6 = _mm512_load_si512(lv[6]);
  for (int k = 0; k < 2; ++k) s->t7[k] = _mm512_load_si512(lv[7] + 32 * k);
  for (int k = 0; k < 4; ++k) s->t8[k] = _mm512_load_si512(lv[8] + 32 * k);
  alignas(64) float thr_rev[256];
  alignas(64) uint8_t c0[256], c1[256];
  for (int r = 0; r < 256; ++r) {
    const int c = BitReverse8(r);
    thr_rev[r] = t.thr[c];
    c0[r] = static_cast<uint8_t>(t.first[c]);
    c1[r] = static_cast<uint8_t>(t.first[std::min(c + 1, 255)]);
  }
  MakePlanes(thr_rev, &s->thr);
  s->sign_fix = t.sign_fix;
  if (t.sign_fix) MakePlanes(t.q, &s->q);
  for (int k = 0; k < 4; ++k) {
    s->code0[k] = _mm512_load_si512(c0 + 64 * k);
    s->code1[k] = _mm512_load_si512(c1 + 64 * k);
  }
  return true;
}

// Bit-reversed c0 of NV x 32 bucket numbers (16-bit), vector j searched in *s[j].
template <int NV>
FUSEKIT_AWQ_VBMI HWY_INLINE void Search16N(const Search16Tables *const s[NV], const __m512i h[NV],
                                           __m512i r[NV]) {
  __mmask32 k6[NV], k7[NV];
  for (int j = 0; j < NV; ++j) {
    r[j] = _mm512_maskz_mov_epi16(_mm512_cmpgt_epu16_mask(h[j], s[j]->t1), _mm512_set1_epi16(1));
  }
#define FUSEKIT_AWQ_LEVEL16(T, BIT)                                                             \
  for (int j = 0; j < NV; ++j) {                                                                \
    const __mmask32 k = _mm512_cmpgt_epu16_mask(h[j], _mm512_permutexvar_epi16(r[j], s[j]->T)); \
    r[j] = _mm512_mask_add_epi16(r[j], k, r[j], _mm512_set1_epi16(BIT));                        \
  }
  FUSEKIT_AWQ_LEVEL16(t2, 2)
  FUSEKIT_AWQ_LEVEL16(t3, 4)
  FUSEKIT_AWQ_LEVEL16(t4, 8)
  FUSEKIT_AWQ_LEVEL16(t5, 16)
  for (int j = 0; j < NV; ++j) {
    k6[j] = _mm512_cmpgt_epu16_mask(h[j], _mm512_permutexvar_epi16(r[j], s[j]->t6));
    r[j] = _mm512_mask_add_epi16(r[j], k6[j], r[j], _mm512_set1_epi16(32));
  }
#undef FUSEKIT_AWQ_LEVEL16
  for (int j = 0; j < NV; ++j) {
    k7[j] =
        _mm512_cmpgt_epu16_mask(h[j], _mm512_permutex2var_epi16(s[j]->t7[0], r[j], s[j]->t7[1]));
    r[j] = _mm512_mask_add_epi16(r[j], k7[j], r[j], _mm512_set1_epi16(64));
  }
  for (int j = 0; j < NV; ++j) {
    const __m512i a = _mm512_permutex2var_epi16(s[j]->t8[0], r[j], s[j]->t8[1]);
    const __m512i b = _mm512_permutex2var_epi16(s[j]->t8[2], r[j], s[j]->t8[3]);
    const __mmask32 k = _mm512_cmpgt_epu16_mask(h[j], _mm512_mask_blend_epi16(k7[j], a, b));
    r[j] = _mm512_mask_add_epi16(r[j], k, r[j], _mm512_set1_epi16(128));
  }
  (void)k6;
}

// A full block's codes for both maps by the 16-bit search; x (the quotients, NaN and -0 as +0)
// overwrite the moments in mom_m / mom_v.
template <bool kSignFix>
FUSEKIT_AWQ_VBMI HWY_INLINE void BlockCodes16(const Search16Tables &sm, const Search16Tables &sv,
                                              float *mom_m, float *mom_v, __m512 vdiv_m,
                                              __m512 vdiv_v, uint8_t *out_m, uint8_t *out_v) {
  alignas(64) uint16_t hb[2][kBlock];
  alignas(64) uint8_t rb[2][kBlock];
  // NaN, +-0 to +0; others kept (vfixupimmps responses: 8 = +0, 1 = the source).
  const __m512i fix = _mm512_set1_epi32(0x11111888);
  const __m512i hi_words =
      _mm512_setr_epi32(0x00030001, 0x00070005, 0x000b0009, 0x000f000d, 0x00130011, 0x00170015,
                        0x001b0019, 0x001f001d, 0x00230021, 0x00270025, 0x002b0029, 0x002f002d,
                        0x00330031, 0x00370035, 0x003b0039, 0x003f003d);
  float *mom[2] = {mom_m, mom_v};
  const __m512 vdiv[2] = {vdiv_m, vdiv_v};
  for (int p = 0; p < 2; ++p) {
    for (int j = 0; j < kBlock; j += 32) {
      __m512i key[2];
      for (int k = 0; k < 2; ++k) {
        __m512 x = _mm512_div_ps(_mm512_load_ps(mom[p] + j + 16 * k), vdiv[p]);
        x = _mm512_fixupimm_ps(x, x, fix, 0);
        _mm512_store_ps(mom[p] + j + 16 * k, x);
        const __m512i bits = _mm512_castps_si512(x);
        key[k] = _mm512_ternarylogic_epi32(bits, _mm512_srai_epi32(bits, 31),
                                           _mm512_set1_epi32(INT32_MIN), 0x1e);
      }
      _mm512_store_si512(hb[p] + j, _mm512_permutex2var_epi16(key[0], hi_words, key[1]));
    }
  }
  const __m512i qorder = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  for (int j0 = 0; j0 < kBlock; j0 += 128) {
    const Search16Tables *s[8] = {&sm, &sm, &sm, &sm, &sv, &sv, &sv, &sv};
    __m512i h[8], r[8];
    for (int k = 0; k < 4; ++k) {
      h[k] = _mm512_load_si512(hb[0] + j0 + 32 * k);
      h[4 + k] = _mm512_load_si512(hb[1] + j0 + 32 * k);
    }
    Search16N<8>(s, h, r);
    for (int p = 0; p < 2; ++p) {
      for (int k = 0; k < 2; ++k) {
        const __m512i b = _mm512_packus_epi16(r[4 * p + 2 * k], r[4 * p + 2 * k + 1]);
        _mm512_store_si512(rb[p] + j0 + 64 * k, _mm512_permutexvar_epi64(qorder, b));
      }
    }
  }
  const Search16Tables *st[2] = {&sm, &sv};
  uint8_t *out[2] = {out_m, out_v};
  for (int p = 0; p < 2; ++p) {
    const Search16Tables &s = *st[p];
    for (int j0 = 0; j0 < kBlock; j0 += 64) {
      const __m512i r = _mm512_load_si512(rb[p] + j0);
      __m512 th[4];
      Dequant64(s.thr, r, th);
      __mmask16 ge[4];
      for (int k = 0; k < 4; ++k)
        ge[k] = _mm512_cmp_ps_mask(_mm512_load_ps(mom[p] + j0 + 16 * k), th[k], _CMP_GE_OQ);
      const __mmask64 up =
          _mm512_kunpackd(_mm512_kunpackw(ge[3], ge[2]), _mm512_kunpackw(ge[1], ge[0]));
      const __mmask64 top = _mm512_movepi8_mask(r);
      const __m512i c0 =
          _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(s.code0[0], r, s.code0[1]),
                                 _mm512_permutex2var_epi8(s.code0[2], r, s.code0[3]));
      const __m512i c1 =
          _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(s.code1[0], r, s.code1[1]),
                                 _mm512_permutex2var_epi8(s.code1[2], r, s.code1[3]));
      __m512i code = _mm512_mask_blend_epi8(up, c0, c1);
      if (kSignFix && s.sign_fix) {
        // x * q[code] < 0 (as the reference computes it): one step toward x's sign, clamped.
        __m512 qc[4];
        Dequant64(s.q, code, qc);
        uint64_t need = 0, pos = 0;
        for (int k = 0; k < 4; ++k) {
          const __m512 x = _mm512_load_ps(mom[p] + j0 + 16 * k);
          need |= static_cast<uint64_t>(_cvtmask16_u32(
                      _mm512_cmp_ps_mask(_mm512_mul_ps(x, qc[k]), _mm512_setzero_ps(), _CMP_LT_OQ)))
                  << (16 * k);
          pos |= static_cast<uint64_t>(
                     _cvtmask16_u32(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ)))
                 << (16 * k);
        }
        const __m512i one = _mm512_set1_epi8(1);
        code = _mm512_mask_adds_epu8(code, _cvtu64_mask64(need & pos), code, one);
        code = _mm512_mask_subs_epu8(code, _cvtu64_mask64(need & ~pos), code, one);
      }
      _mm512_storeu_si512(out[p] + j0, code);
    }
  }
}

// kCodes: 0: the 32-bit search; 1: the 16-bit search; 2: the 16-bit search and m's sign fix (each
// its own instantiation: a branch for an unused step made GCC allocate the hot loops worse).
template <typename T, int kCodes>
FUSEKIT_AWQ_VBMI HWY_NOINLINE int64_t FastBlocks(const AdamWQuantArgs &a, int64_t begin,
                                                 int64_t end) {
  const hn::ScalableTag<float> df;
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  BytePlanes pm, pv;
  MakePlanes(a.map_m.q, &pm);
  MakePlanes(a.map_v.q, &pv);
  SearchTables search_m, search_v;
  Search16Tables s16_m, s16_v;
  if (kCodes > 0) {
    (void)MakeSearch16(a.map_m, &s16_m);
    (void)MakeSearch16(a.map_v, &s16_v);
  } else {
    MakeSearch(a.map_m, &search_m);
    MakeSearch(a.map_v, &search_v);
  }
  const AdamVectors<decltype(df)> adam(df, a);
  alignas(64) float m_new[kBlock];
  alignas(64) float v_new[kBlock];
  int64_t skipped = 0;
  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock;
    if (lo + kBlock > a.n) {
      skipped += QuantBlocks<T>(a, b, b + 1);
      continue;
    }
    if (!BlockFinite(grad + lo)) {
      ++skipped;
      continue;
    }
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const __m512 vscale_m = _mm512_set1_ps(*absmax_m), vscale_v = _mm512_set1_ps(*absmax_v);
    __m512 acc_m = _mm512_setzero_ps();
    __m512 acc_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 < kBlock; j0 += 64) {
      __m512 qm[4], qv[4];
      Dequant64(pm, _mm512_loadu_si512(a.m + lo + j0), qm);
      Dequant64(pv, _mm512_loadu_si512(a.v + lo + j0), qv);
      for (int k = 0; k < 4; ++k) {
        const int64_t j = j0 + 16 * k, i = lo + j;
        hn::Vec512<float> m{_mm512_mul_ps(qm[k], vscale_m)}, v{_mm512_mul_ps(qv[k], vscale_v)};
        StoreNarrow(df, adam.Update(LoadWide(df, grad + i), m, v, LoadWide(df, var + i)), var + i);
        _mm512_store_ps(m_new + j, m.raw);
        _mm512_store_ps(v_new + j, v.raw);
        acc_m = _mm512_max_ps(_mm512_abs_ps(m.raw), acc_m);
        acc_v = _mm512_max_ps(v.raw, acc_v);
      }
    }
    float max_m = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_m}));
    float max_v = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_v}));
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
      BlockCodes2(df, a, search_m, search_v, m_new, v_new, vdiv_m, vdiv_v, lo);
    }
  }
  return skipped;
}

template <typename T>
int64_t FastBlocksAuto(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  if (DistinctBuckets(a.map_m) && DistinctBuckets(a.map_v)) {
    return a.map_m.sign_fix ? FastBlocks<T, 2>(a, begin, end) : FastBlocks<T, 1>(a, begin, end);
  }
  return FastBlocks<T, 0>(a, begin, end);
}

inline bool HaveVbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}
#pragma GCC diagnostic pop
#else
#define FUSEKIT_AWQ_FAST 0
#endif

int64_t AdamWQuantBlocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
#if FUSEKIT_AWQ_FAST
  if (HaveVbmi()) {
    switch (a.dtype) {
      case DType::kFloat16:
        return FastBlocksAuto<float16_t>(a, begin, end);
      case DType::kBFloat16:
        return FastBlocksAuto<bfloat16_t>(a, begin, end);
      default:
        return FastBlocksAuto<float>(a, begin, end);
    }
  }
#endif
  switch (a.dtype) {
    case DType::kFloat16:
      return QuantBlocks<float16_t>(a, begin, end);
    case DType::kBFloat16:
      return QuantBlocks<bfloat16_t>(a, begin, end);
    default:
      return QuantBlocks<float>(a, begin, end);
  }
}

template <typename T>
int64_t Elements(const AdamWArgs &a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  const auto zero = hn::Zero(df);
  const AdamVectors<decltype(df)> adam(df, a);
  int64_t skipped = 0;
  auto scalar = [&](int64_t i) {
    const float gr = to_float(grad[i]);
    if (!std::isfinite(gr)) {
      ++skipped;
      return;
    }
    var[i] = from_float<T>(adam_update(a, gr, &a.m[i], &a.v[i], to_float(var[i])));
  };
  int64_t i = begin;
  for (; i + N <= end; i += N) {
    const auto gr = LoadWide(df, grad + i);
    if (!hn::AllTrue(df, hn::Eq(hn::Mul(gr, zero), zero))) {
      for (int64_t k = i; k < i + N; ++k) scalar(k);
      continue;
    }
    auto m = hn::LoadU(df, a.m + i), v = hn::LoadU(df, a.v + i);
    StoreNarrow(df, adam.Update(gr, m, v, LoadWide(df, var + i)), var + i);
    hn::StoreU(m, df, a.m + i);
    hn::StoreU(v, df, a.v + i);
  }
  for (; i < end; ++i) scalar(i);
  return skipped;
}

int64_t AdamWElements(const AdamWArgs &a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::kFloat16:
      return Elements<float16_t>(a, begin, end);
    case DType::kBFloat16:
      return Elements<bfloat16_t>(a, begin, end);
    default:
      return Elements<float>(a, begin, end);
  }
}

const char *TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

// Whether AdamWQuantBlocks reads the lookup tables (packed or count table) of QuantMapTables.
bool UsesTables() {
#if FUSEKIT_AWQ_FAST
  return !HaveVbmi();
#else
  return true;
#endif
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(AdamWQuantBlocks);
HWY_EXPORT(AdamWElements);
HWY_EXPORT(TargetName);
HWY_EXPORT(UsesTables);

namespace {
void init_targets() {
  if (!hwy::GetChosenTarget().IsInitialized())
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace

AdamWQuantBlocksFn adam_w_quant_blocks_optimized() {
  init_targets();
  return HWY_DYNAMIC_DISPATCH(AdamWQuantBlocks);
}
AdamWElementsFn adam_w_elements_optimized() {
  init_targets();
  return HWY_DYNAMIC_DISPATCH(AdamWElements);
}
const char *adam_w_quant_optimized_target() {
  init_targets();
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}
bool adam_w_quant_optimized_uses_tables() {
  init_targets();
  return HWY_DYNAMIC_DISPATCH(UsesTables)();
}

}  // namespace fusekit
#endif  // HWY_ONCE
