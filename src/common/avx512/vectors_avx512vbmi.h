// fusekit internal: partial vectors and the storage types on AVX-512 (with VBMI, as the kernels
// that use them are compiled), for the single-ISA sources (src/<op>/<op>_avx512vbmi.cc; see
// common/avx512/quant_codes_avx512vbmi.h for how they are compiled): cache-line helpers, masks,
// code loads and stores that stay within a row's cache lines, float32 vectors from float32,
// bfloat16 and float16 and back (the same instructions as Highway's LoadWide / StoreNarrow on
// AVX3, common/hwy_dtype-inl.h). Everything is in an anonymous namespace (a copy per including
// file).
#ifndef FUSEKIT_COMMON_AVX512_VECTORS_AVX512VBMI_H_
#define FUSEKIT_COMMON_AVX512_VECTORS_AVX512VBMI_H_

#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/avx512/quant_codes_avx512vbmi.h"  // FUSEKIT_QUANT_VBMI
#include "fusekit/float16.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace {

// Whether [p, p + bytes) and [q, q + bytes) lie in the same cache lines (a packed state: m's and
// v's codes, or their absmax, in one row of one table).
HWY_INLINE bool SameLines(const void *p, const void *q, int64_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  const auto n = static_cast<uintptr_t>(bytes) - 1;
  return a / 64 == b / 64 && (a + n) / 64 == (b + n) / 64;
}

// Prefetches each cache line of [p, p + bytes) once.
FUSEKIT_QUANT_VBMI HWY_INLINE void PrefetchLines(const void *p, int64_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const auto last =
      (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1) & ~uintptr_t{63};
  for (uintptr_t line = first; line <= last; line += 64)
    hwy::Prefetch(reinterpret_cast<const char *>(line));
}

FUSEKIT_QUANT_VBMI HWY_INLINE __mmask16 LaneMask(int64_t lanes) {
  return lanes >= 16 ? static_cast<__mmask16>(0xffff)
                     : static_cast<__mmask16>((1u << static_cast<unsigned>(lanes)) - 1u);
}
FUSEKIT_QUANT_VBMI HWY_INLINE __mmask64 ByteMask(int64_t bytes) {
  return bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << static_cast<unsigned>(bytes)) - 1;
}

// A vector access past the end of a table row must not reach a cache line the row does not
// occupy: masked-off lanes still make the core fetch (or, for a store, own) every line the access
// spans, and the line after a random row is a miss of its own. Measured at D = 32: 64-byte masked
// code loads and stores at rows that start mid-line took the step from 1.9 to 4 ns per element.
// So a partial access is masked only when it stays within the row's lines, else it goes through a
// small local buffer.
FUSEKIT_QUANT_VBMI HWY_INLINE bool WithinLines(const void *p, int64_t n, int64_t w) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return (a + static_cast<uintptr_t>(w) - 1) / 64 == (a + static_cast<uintptr_t>(n) - 1) / 64;
}

// n (1 to 64) codes at p, zero past n.
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i LoadCodes(const uint8_t *p, int64_t n) {
  if (n >= 64) return _mm512_loadu_si512(p);
  if (WithinLines(p, n, 64)) return _mm512_maskz_loadu_epi8(ByteMask(n), p);
  if (n <= 32 && WithinLines(p, n, 32)) {
    return _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(static_cast<__mmask32>(ByteMask(n)), p));
  }
  alignas(64) uint8_t tmp[64] = {};
  for (int64_t j = 0; j < n; ++j) tmp[j] = p[j];
  return _mm512_load_si512(tmp);
}
// The first n (1 to 64) bytes of `codes` (64 readable) to p.
FUSEKIT_QUANT_VBMI HWY_INLINE void StoreCodes(const uint8_t *codes, int64_t n, uint8_t *p) {
  const __m512i c = _mm512_loadu_si512(codes);
  if (n >= 64) {
    _mm512_storeu_si512(p, c);
  } else if (WithinLines(p, n, 64)) {
    _mm512_mask_storeu_epi8(p, ByteMask(n), c);
  } else if (n <= 32 && WithinLines(p, n, 32)) {
    _mm256_mask_storeu_epi8(p, static_cast<__mmask32>(ByteMask(n)), _mm512_castsi512_si256(c));
  } else {
    for (int64_t j = 0; j < n; ++j) p[j] = codes[j];
  }
}

// ---- float32 vectors from the three storage types, `lanes` (1 to 16) of them, 0 past the end and
// not stored there. The same instructions as Highway's LoadWide / StoreNarrow on AVX3
// (common/hwy_dtype-inl.h): float16 by vcvtph2ps / vcvtps2ph (round to nearest-even), bfloat16 by
// shifts and the integer rounding to nearest-even.
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 Widen(const float *p) {
  return _mm512_loadu_ps(p);
}
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 Widen(const bfloat16_t *p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 Widen(const float16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 WidenMasked(const float *p, __mmask16 k) {
  return _mm512_maskz_loadu_ps(k, p);
}
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 WidenMasked(const bfloat16_t *p, __mmask16 k) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 WidenMasked(const float16_t *p, __mmask16 k) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}
template <typename E>
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 LoadWideN(const E *p, int64_t lanes) {
  if (lanes >= 16) return Widen(p);
  const auto n = lanes * static_cast<int64_t>(sizeof(E));
  if (WithinLines(p, n, 16 * static_cast<int64_t>(sizeof(E))))
    return WidenMasked(p, LaneMask(lanes));
  alignas(64) E tmp[16] = {};
  for (int64_t j = 0; j < lanes; ++j) tmp[j] = p[j];
  return Widen(tmp);
}

FUSEKIT_QUANT_VBMI HWY_INLINE void NarrowMasked(__m512 w, float *p, __mmask16 k) {
  _mm512_mask_storeu_ps(p, k, w);
}
FUSEKIT_QUANT_VBMI HWY_INLINE void NarrowMasked(__m512 w, bfloat16_t *p, __mmask16 k) {
  const __m512i bits = _mm512_castps_si512(w);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i quiet_nan =
      _mm512_srli_epi32(_mm512_or_si512(bits, _mm512_set1_epi32(0x00400000)), 16);
  const __m512i r =
      _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q), quiet_nan);
  _mm512_mask_cvtepi32_storeu_epi16(p, k, r);
}
FUSEKIT_QUANT_VBMI HWY_INLINE void NarrowMasked(__m512 w, float16_t *p, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <typename E>
FUSEKIT_QUANT_VBMI HWY_INLINE void StoreNarrowN(__m512 w, E *p, int64_t lanes) {
  const auto n = std::min<int64_t>(lanes, 16) * static_cast<int64_t>(sizeof(E));
  if (lanes >= 16 || WithinLines(p, n, 16 * static_cast<int64_t>(sizeof(E)))) {
    NarrowMasked(w, p, LaneMask(lanes));
    return;
  }
  alignas(64) E tmp[16];
  NarrowMasked(w, tmp, LaneMask(16));
  for (int64_t j = 0; j < lanes; ++j) p[j] = tmp[j];
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_AVX512_VECTORS_AVX512VBMI_H_
