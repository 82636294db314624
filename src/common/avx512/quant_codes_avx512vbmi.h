// fusekit internal: the AVX-512 VBMI nearest-code search and dequantization of the 8-bit
// optimizers (ApplyAdamWQuant's cpu_avx512vbmi kernel, and LazyAdamQuant's): the maps as byte
// planes in registers (Dequant64), the in-register binary searches over the decision thresholds
// (32-bit SearchN, 16-bit Search16N), the block code routines (BlockCodes2, BlockCodes16), and the
// register tables of one run (VbmiTables, PrepareTables). The tables are common/quant_search.h;
// docs/apply_adam_w_quant.md explains the method.
//
// For the single-ISA sources (src/<op>/<op>_avx512vbmi.cc), which are compiled once, for one
// target, with their own flags (fusekit_avx512vbmi_sources in CMakeLists.txt): Highway's static
// target set to AVX3 (AVX-512 F, BW, DQ, VL), so that Highway's code and ours carry that target's
// attributes and the rest of the library is unaffected, and no per-target passes. The functions
// here and the kernels' own add VBMI (FUSEKIT_QUANT_VBMI). Call them only where
// avx512vbmi_cpu_why_not() is null. Everything is in an anonymous namespace (a copy per including
// file).
#ifndef FUSEKIT_COMMON_AVX512_QUANT_CODES_AVX512VBMI_H_
#define FUSEKIT_COMMON_AVX512_QUANT_CODES_AVX512VBMI_H_

#include <hwy/highway.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "common/quant_codes_hwy-inl.h"  // Codes, for maps where m's sign fix acts (GenericCodes)
#include "common/quant_search.h"

#if HWY_TARGET != HWY_AVX3
#error "compile with fusekit_avx512vbmi_sources (Highway's static target AVX3)"
#endif

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

constexpr int kQuantBlock = 256;  // the values one block routine codes

#define FUSEKIT_QUANT_VBMI __attribute__((target(HWY_TARGET_STR ",avx512vbmi")))

// ---- AVX-512 with VBMI: no gathers for the dequantization ------------------------------------
// The two 256-float maps are split into four byte planes each (byte p of every entry's bits: 256
// bytes, four registers); one code vector of 64 bytes is looked up in each plane with two
// two-register byte permutes (`vpermt2b`, 7-bit index) and a blend on the code's top bit, and the
// four planes are interleaved back into floats with unpacks. The unpacks interleave within 128-bit
// lanes, so the codes are first permuted (a 4x4 transpose of their dwords) to make the floats come
// out in element order.

struct BytePlanes {
  __m512i lo[4][2];  // plane p, entries 0..63 and 64..127
  __m512i hi[4][2];  // entries 128..191 and 192..255
};

FUSEKIT_QUANT_VBMI inline void MakePlanes(const float *q, BytePlanes *bp) {
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
FUSEKIT_QUANT_VBMI HWY_INLINE void Dequant64(const BytePlanes &bp, __m512i codes, __m512 out[4]) {
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

// q[code] for the first 32 of 64 codes, as two vectors of 16 floats in element order (Dequant64's
// out[0] and out[1], with half the unpacks).
FUSEKIT_QUANT_VBMI HWY_INLINE void Dequant32(const BytePlanes &bp, __m512i codes, __m512 out[2]) {
  const __m512i c = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), codes);
  const __mmask64 top = _mm512_movepi8_mask(c);
  __m512i p[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i l = _mm512_permutex2var_epi8(bp.lo[k][0], c, bp.lo[k][1]);
    const __m512i h = _mm512_permutex2var_epi8(bp.hi[k][0], c, bp.hi[k][1]);
    p[k] = _mm512_mask_blend_epi8(top, l, h);
  }
  const __m512i lo01 = _mm512_unpacklo_epi8(p[0], p[1]), lo23 = _mm512_unpacklo_epi8(p[2], p[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23));
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

FUSEKIT_QUANT_VBMI inline void MakeSearch(const QuantMapTables &t, SearchTables *s) {
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
FUSEKIT_QUANT_VBMI HWY_INLINE void SearchN(const SearchTables *const s[NV], const __m512 xin[NV],
                                           __m512i r[NV]) {
  __m512 x[NV];
  __mmask16 k6[NV], k7[NV];
  for (int j = 0; j < NV; ++j) {
    x[j] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(xin[j], xin[j], _CMP_ORD_Q), xin[j]);
    r[j] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(x[j], _mm512_set1_ps(s[j]->t1), _CMP_GE_OQ),
                                  _mm512_set1_epi32(1));
  }
#define FUSEKIT_QUANT_LEVEL(T, BIT)                                                 \
  for (int j = 0; j < NV; ++j) {                                                    \
    const __mmask16 k =                                                             \
        _mm512_cmp_ps_mask(x[j], _mm512_permutexvar_ps(r[j], s[j]->T), _CMP_GE_OQ); \
    r[j] = _mm512_mask_or_epi32(r[j], k, r[j], _mm512_set1_epi32(BIT));             \
  }
  FUSEKIT_QUANT_LEVEL(t2, 2)
  FUSEKIT_QUANT_LEVEL(t3, 4)
  FUSEKIT_QUANT_LEVEL(t4, 8)
  FUSEKIT_QUANT_LEVEL(t5, 16)
#undef FUSEKIT_QUANT_LEVEL
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
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i PathsToCodes(const SearchTables &s, const __m512i r[4]) {
  const __m512i p01 = _mm512_packus_epi32(r[0], r[1]), p23 = _mm512_packus_epi32(r[2], r[3]);
  const __m512i b = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
      _mm512_packus_epi16(p01, p23));
  const __m512i lo = _mm512_permutex2var_epi8(s.code[0], b, s.code[1]);
  const __m512i hi = _mm512_permutex2var_epi8(s.code[2], b, s.code[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(b), lo, hi);
}

// x = moment / div for 16 lanes (kDivide), or the moment itself (already divided by the caller).
template <bool kDivide>
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 Quotient(const float *mom, __m512 vdiv) {
  return kDivide ? _mm512_div_ps(_mm512_load_ps(mom), vdiv) : _mm512_load_ps(mom);
}

// A full block's codes of x = moment / div for both maps (kDivide; else the moments are the
// quotients already): the in-register search, both maps' vectors together; a map where the sign
// fix can act takes the generic search per vector.
template <bool kDivide, class DF>
FUSEKIT_QUANT_VBMI HWY_INLINE void GenericCodes(DF df, const QuantMapTables &t, const float *mom,
                                                __m512 vdiv, uint8_t *out) {
  for (int j = 0; j < kQuantBlock; j += 16) {
    const __m512i c = Codes(df, t, hn::Vec512<float>{Quotient<kDivide>(mom + j, vdiv)}).raw;
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out + j), _mm512_cvtepi32_epi8(c));
  }
}

template <bool kDivide = true, class DF>
FUSEKIT_QUANT_VBMI HWY_INLINE void BlockCodes2(DF df, const QuantMapTables &map_m,
                                               const SearchTables &sm, const SearchTables &sv,
                                               const float *m_new, const float *v_new,
                                               __m512 vdiv_m, __m512 vdiv_v, uint8_t *out_m,
                                               uint8_t *out_v) {
  if (map_m.sign_fix) {
    GenericCodes<kDivide>(df, map_m, m_new, vdiv_m, out_m);
    for (int j0 = 0; j0 < kQuantBlock; j0 += 64) {
      const SearchTables *s[4] = {&sv, &sv, &sv, &sv};
      __m512 x[4];
      __m512i r[4];
      for (int k = 0; k < 4; ++k) x[k] = Quotient<kDivide>(v_new + j0 + 16 * k, vdiv_v);
      SearchN<4>(s, x, r);
      _mm512_storeu_si512(out_v + j0, PathsToCodes(sv, r));
    }
    return;
  }
  for (int j0 = 0; j0 < kQuantBlock; j0 += 64) {
    const SearchTables *s[8] = {&sm, &sm, &sm, &sm, &sv, &sv, &sv, &sv};
    __m512 x[8];
    __m512i r[8];
    for (int k = 0; k < 4; ++k) {
      x[k] = Quotient<kDivide>(m_new + j0 + 16 * k, vdiv_m);
      x[4 + k] = Quotient<kDivide>(v_new + j0 + 16 * k, vdiv_v);
    }
    SearchN<8>(s, x, r);
    _mm512_storeu_si512(out_m + j0, PathsToCodes(sm, r));
    _mm512_storeu_si512(out_v + j0, PathsToCodes(sv, r + 4));
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
  bool identity;               // first[c] == c (no repeated map values): code = bitrev(r) + up
  __m512i code0[4], code1[4];  // first[bitrev(r)], first[bitrev(r) + 1]
  __m512i rev[2];              // bitrev8(i) for i = 0..127 (bit 7 of r adds 1)
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
FUSEKIT_QUANT_VBMI inline bool MakeSearch16(const QuantMapTables &t, Search16Tables *s) {
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
  s->identity = t.identity_first;
  alignas(64) uint8_t rev[128];
  for (int i = 0; i < 128; ++i) rev[i] = static_cast<uint8_t>(BitReverse8(i));
  s->rev[0] = _mm512_load_si512(rev);
  s->rev[1] = _mm512_load_si512(rev + 64);
  if (t.sign_fix) MakePlanes(t.q, &s->q);
  for (int k = 0; k < 4; ++k) {
    s->code0[k] = _mm512_load_si512(c0 + 64 * k);
    s->code1[k] = _mm512_load_si512(c1 + 64 * k);
  }
  return true;
}

// Bit-reversed c0 of NV x 32 bucket numbers (16-bit), vector j searched in *s[j].
template <int NV>
FUSEKIT_QUANT_VBMI HWY_INLINE void Search16N(const Search16Tables *const s[NV], const __m512i h[NV],
                                             __m512i r[NV]) {
  __mmask32 k6[NV], k7[NV];
  for (int j = 0; j < NV; ++j) {
    r[j] = _mm512_maskz_mov_epi16(_mm512_cmpgt_epu16_mask(h[j], s[j]->t1), _mm512_set1_epi16(1));
  }
#define FUSEKIT_QUANT_LEVEL16(T, BIT)                                                           \
  for (int j = 0; j < NV; ++j) {                                                                \
    const __mmask32 k = _mm512_cmpgt_epu16_mask(h[j], _mm512_permutexvar_epi16(r[j], s[j]->T)); \
    r[j] = _mm512_mask_add_epi16(r[j], k, r[j], _mm512_set1_epi16(BIT));                        \
  }
  FUSEKIT_QUANT_LEVEL16(t2, 2)
  FUSEKIT_QUANT_LEVEL16(t3, 4)
  FUSEKIT_QUANT_LEVEL16(t4, 8)
  FUSEKIT_QUANT_LEVEL16(t5, 16)
  for (int j = 0; j < NV; ++j) {
    k6[j] = _mm512_cmpgt_epu16_mask(h[j], _mm512_permutexvar_epi16(r[j], s[j]->t6));
    r[j] = _mm512_mask_add_epi16(r[j], k6[j], r[j], _mm512_set1_epi16(32));
  }
#undef FUSEKIT_QUANT_LEVEL16
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

// A value as the 16-bit search takes it: NaN and -0 as +0, others kept (vfixupimmps responses:
// 8 = +0, 1 = the source).
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 SearchValue(__m512 x) {
  return _mm512_fixupimm_ps(x, x, _mm512_set1_epi32(0x11111888), 0);
}

// The bucket numbers (the high 16 bits of the monotone keys) of 32 search values, in order.
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i BucketNumbers(__m512 x0, __m512 x1) {
  const __m512i hi_words =
      _mm512_setr_epi32(0x00030001, 0x00070005, 0x000b0009, 0x000f000d, 0x00130011, 0x00170015,
                        0x001b0019, 0x001f001d, 0x00230021, 0x00270025, 0x002b0029, 0x002f002d,
                        0x00330031, 0x00370035, 0x003b0039, 0x003f003d);
  const __m512i b0 = _mm512_castps_si512(x0), b1 = _mm512_castps_si512(x1);
  const __m512i k0 =
      _mm512_ternarylogic_epi32(b0, _mm512_srai_epi32(b0, 31), _mm512_set1_epi32(INT32_MIN), 0x1e);
  const __m512i k1 =
      _mm512_ternarylogic_epi32(b1, _mm512_srai_epi32(b1, 31), _mm512_set1_epi32(INT32_MIN), 0x1e);
  return _mm512_permutex2var_epi16(k0, hi_words, k1);
}

// Two vectors of 32 bit-reversed c0 (16-bit, from Search16N) as 64 bytes in element order.
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i PackPaths(__m512i r0, __m512i r1) {
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                  _mm512_packus_epi16(r0, r1));
}

// The 64 codes of search values x[0..3] whose bit-reversed c0 are the bytes of r: c0 or c0 + 1 by
// the one full comparison with thr[c0], then (kSignFix, where the map's fix can act) m's sign fix.
template <bool kSignFix>
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i CodesOfPaths(const Search16Tables &s, __m512i r,
                                                   const __m512 x[4]) {
  __m512 th[4];
  Dequant64(s.thr, r, th);
  __mmask16 ge[4];
  for (int k = 0; k < 4; ++k) ge[k] = _mm512_cmp_ps_mask(x[k], th[k], _CMP_GE_OQ);
  const __mmask64 up =
      _mm512_kunpackd(_mm512_kunpackw(ge[3], ge[2]), _mm512_kunpackw(ge[1], ge[0]));
  const __mmask64 top = _mm512_movepi8_mask(r);
  __m512i code;
  if (s.identity) {  // the count is the code: bitrev(r), plus one where x passed thr[c0]
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i rev = _mm512_permutex2var_epi8(s.rev[0], r, s.rev[1]);  // r's low 7 bits
    const __m512i c0 = _mm512_mask_add_epi8(rev, top, rev, one);  // bit 7 of r is bit 0 of c0
    code = _mm512_mask_add_epi8(c0, up, c0, one);
  } else {
    const __m512i c0 =
        _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(s.code0[0], r, s.code0[1]),
                               _mm512_permutex2var_epi8(s.code0[2], r, s.code0[3]));
    const __m512i c1 =
        _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(s.code1[0], r, s.code1[1]),
                               _mm512_permutex2var_epi8(s.code1[2], r, s.code1[3]));
    code = _mm512_mask_blend_epi8(up, c0, c1);
  }
  if (kSignFix && s.sign_fix) {
    // x * q[code] < 0 (as the reference computes it): one step toward x's sign, clamped.
    __m512 qc[4];
    Dequant64(s.q, code, qc);
    uint64_t need = 0, pos = 0;
    for (int k = 0; k < 4; ++k) {
      need |= static_cast<uint64_t>(_cvtmask16_u32(
                  _mm512_cmp_ps_mask(_mm512_mul_ps(x[k], qc[k]), _mm512_setzero_ps(), _CMP_LT_OQ)))
              << (16 * k);
      pos |= static_cast<uint64_t>(
                 _cvtmask16_u32(_mm512_cmp_ps_mask(x[k], _mm512_setzero_ps(), _CMP_GT_OQ)))
             << (16 * k);
    }
    const __m512i one = _mm512_set1_epi8(1);
    code = _mm512_mask_adds_epu8(code, _cvtu64_mask64(need & pos), code, one);
    code = _mm512_mask_subs_epu8(code, _cvtu64_mask64(need & ~pos), code, one);
  }
  return code;
}

// A full block's codes for both maps by the 16-bit search; x (the quotients moment / div, or with
// kDivide false the moments themselves, NaN and -0 as +0) overwrite the moments in mom_m / mom_v.
template <bool kSignFix, bool kDivide = true>
FUSEKIT_QUANT_VBMI HWY_INLINE void BlockCodes16(const Search16Tables &sm, const Search16Tables &sv,
                                                float *mom_m, float *mom_v, __m512 vdiv_m,
                                                __m512 vdiv_v, uint8_t *out_m, uint8_t *out_v) {
  alignas(64) uint16_t hb[2][kQuantBlock];
  alignas(64) uint8_t rb[2][kQuantBlock];
  float *mom[2] = {mom_m, mom_v};
  const __m512 vdiv[2] = {vdiv_m, vdiv_v};
  for (int p = 0; p < 2; ++p) {
    for (int j = 0; j < kQuantBlock; j += 32) {
      __m512 x[2];
      for (int k = 0; k < 2; ++k) {
        x[k] = SearchValue(Quotient<kDivide>(mom[p] + j + 16 * k, vdiv[p]));
        _mm512_store_ps(mom[p] + j + 16 * k, x[k]);
      }
      _mm512_store_si512(hb[p] + j, BucketNumbers(x[0], x[1]));
    }
  }
  for (int j0 = 0; j0 < kQuantBlock; j0 += 128) {
    const Search16Tables *s[8] = {&sm, &sm, &sm, &sm, &sv, &sv, &sv, &sv};
    __m512i h[8], r[8];
    for (int k = 0; k < 4; ++k) {
      h[k] = _mm512_load_si512(hb[0] + j0 + 32 * k);
      h[4 + k] = _mm512_load_si512(hb[1] + j0 + 32 * k);
    }
    Search16N<8>(s, h, r);
    for (int p = 0; p < 2; ++p) {
      for (int k = 0; k < 2; ++k) {
        _mm512_store_si512(rb[p] + j0 + 64 * k, PackPaths(r[4 * p + 2 * k], r[4 * p + 2 * k + 1]));
      }
    }
  }
  const Search16Tables *st[2] = {&sm, &sv};
  uint8_t *out[2] = {out_m, out_v};
  for (int p = 0; p < 2; ++p) {
    for (int j0 = 0; j0 < kQuantBlock; j0 += 64) {
      __m512 x[4];
      for (int k = 0; k < 4; ++k) x[k] = _mm512_load_ps(mom[p] + j0 + 16 * k);
      _mm512_storeu_si512(out[p] + j0,
                          CodesOfPaths<kSignFix>(*st[p], _mm512_load_si512(rb[p] + j0), x));
    }
  }
}

// ---- the tables of one run ---------------------------------------------------------------------
// What a kernel derives from the two maps' search tables, built once per run instead of on each
// call (ApplyAdamWQuant's CPU run caches them with the maps' tables).
struct VbmiTables {
  int mode;  // 0: the 32-bit search; 1: the 16-bit search; 2: the 16-bit search and m's sign fix
  BytePlanes pm, pv;                // the maps, for the dequantization
  SearchTables search_m, search_v;  // mode 0
  Search16Tables s16_m, s16_v;      // modes 1 and 2
};
static_assert(sizeof(VbmiTables) <= kQuantVbmiTablesBytes);
static_assert(alignof(VbmiTables) <= 64);

FUSEKIT_QUANT_VBMI void PrepareTables(const QuantMapTables &m, const QuantMapTables &v, void *out) {
  auto *t = ::new (out) VbmiTables;
  MakePlanes(m.q, &t->pm);
  MakePlanes(v.q, &t->pv);
  if (DistinctBuckets(m) && DistinctBuckets(v)) {
    (void)MakeSearch16(m, &t->s16_m);
    (void)MakeSearch16(v, &t->s16_v);
    t->mode = m.sign_fix ? 2 : 1;
  } else {
    MakeSearch(m, &t->search_m);
    MakeSearch(v, &t->search_v);
    t->mode = 0;
  }
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_AVX512_QUANT_CODES_AVX512VBMI_H_
