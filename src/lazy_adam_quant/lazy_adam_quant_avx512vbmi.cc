// LazyAdamQuant, the cpu_avx512vbmi implementation's kernel: AVX-512 with VBMI (Zen 4, Ice Lake and
// later). Nothing is gathered: the maps are byte planes in registers for the dequantization, and
// the codes come from ApplyAdamWQuant's in-register searches
// (common/avx512/quant_codes_avx512vbmi.h: Dequant64, BlockCodes16, BlockCodes2, the register
// tables of one run).
//
// Per touched row (whole rows, as the other kernels): the gradient rows summed in order of
// occurrence (float32), then per block of 256 columns, 64 codes at a time (masked loads past D),
// the dequantization, LazyAdam's update, the new m, v and var into the thread's scratch with the
// block maxima and var's largest magnitude; then the row's guard; then var (masked stores past D)
// and absmax stored, and the normalized values m / absmax and v / absmax appended to a staging
// buffer of 256 lanes (a row's block may straddle two fills). Each full staging buffer runs one
// 256-lane search, both maps together (eight independent chains per level, as in
// ApplyAdamWQuant), and its codes are copied to the rows they belong to: at D = 32 one search
// serves eight rows instead of running eight 32-lane searches of one chain each. The codes of a
// row are thus stored a few rows after its var, all within the same call. Prefetches the
// gradient, var, code and absmax rows of the entry a few ahead. Bitwise the results of the other
// kernels.
//
// A single-ISA source, compiled once with its own flags (fusekit_avx512vbmi_sources in
// CMakeLists.txt: Highway's static target AVX3, no per-target passes), with VBMI added to its
// functions' target attributes; the implementation list runs it only where the CPU has AVX-512 F,
// BW, DQ, VL and VBMI.
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "common/quant_search.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

#if HWY_ARCH_X86
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/adam_update.h"
#include "common/avx512/quant_codes_avx512vbmi.h"
#include "common/avx512/vectors_avx512vbmi.h"
#include "common/quant_codes_hwy-inl.h"
#include "fusekit/float16.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

// The row's gradient in float32 into g (the scratch row: D floats rounded up to 16, and more): the
// first occurrence widened, then each later one added in order (the reference's sum, operation for
// operation). Lanes past D hold zeros plus zeros.
template <typename G>
FUSEKIT_QUANT_VBMI HWY_INLINE void SumGradient(const LazyAdamQuantRowsArgs &a, int64_t k,
                                               int64_t next, float *g) {
  const int64_t D = a.dim;
  auto row = [&](int64_t q) {
    return static_cast<const G *>(a.grad) +
           static_cast<int64_t>(a.entries[q] & 0xffffffffu) * a.grad_stride;
  };
  const G *g0 = row(k);
  for (int64_t j = 0; j < D; j += 16) _mm512_storeu_ps(g + j, LoadWideN(g0 + j, D - j));
  for (int64_t q = k + 1; q < next; ++q) {
    const G *h = row(q);
    for (int64_t j = 0; j < D; j += 16) {
      _mm512_storeu_ps(g + j, _mm512_add_ps(_mm512_loadu_ps(g + j), LoadWideN(h + j, D - j)));
    }
  }
}

// ---- the staging buffer of normalized values ---------------------------------------------------
// Lanes [0, fill) hold m / absmax_m and v / absmax_v of rows already stored; segments say where
// their codes go. A block of up to 256 lanes is appended whole (vectors past its end are
// overwritten by the next one); when fill reaches 256 the first 256 lanes are searched and their
// codes copied out, and what lies past 256 moves to the front.
struct Segment {
  int32_t off, len;
  uint8_t *m, *v;
};

struct Staging {
  alignas(64) float xm[2 * kQuantBlock + 64];
  alignas(64) float xv[2 * kQuantBlock + 64];
  Segment seg[kQuantBlock + 2];
  int nseg = 0;
  int64_t fill = 0;
};

// Copies codes[0, len) to dst, 64 bytes at a time (`codes` readable 64 bytes past len).
FUSEKIT_QUANT_VBMI HWY_INLINE void CopyCodes(const uint8_t *codes, int64_t len, uint8_t *dst) {
  for (int64_t j = 0; j < len; j += 64)
    StoreCodes(codes + j, std::min<int64_t>(64, len - j), dst + j);
}

// kMode: the register tables' mode (0: 32-bit search; 1: 16-bit search; 2: 16-bit search and m's
// sign fix), each its own instantiation as in ApplyAdamWQuant's kernel.
template <int kMode>
struct Searcher {
  const QuantMapTables *map_m;
  SearchTables search_m, search_v;
  Search16Tables s16_m, s16_v;

  // Codes of the first 256 lanes of the staging buffer (the quotients already formed).
  FUSEKIT_QUANT_VBMI HWY_INLINE void Codes256(Staging &st, uint8_t *out_m, uint8_t *out_v) {
    const __m512 one = _mm512_set1_ps(1.0f);  // not used: the lanes are quotients already
    if constexpr (kMode > 0) {
      BlockCodes16<kMode == 2, false>(s16_m, s16_v, st.xm, st.xv, one, one, out_m, out_v);
    } else {
      const hn::ScalableTag<float> df;
      BlockCodes2<false>(df, *map_m, search_m, search_v, st.xm, st.xv, one, one, out_m, out_v);
    }
  }

  // Searches lanes [0, 256) (those past fill zeroed first), copies every segment's codes that lie
  // there, and keeps what lies past 256.
  FUSEKIT_QUANT_VBMI HWY_INLINE void Flush(Staging &st) {
    if (st.nseg == 0) return;
    for (int64_t j = st.fill; j < kQuantBlock; ++j) st.xm[j] = st.xv[j] = 0.0f;
    alignas(64) uint8_t cm[kQuantBlock + 64], cv[kQuantBlock + 64];
    Codes256(st, cm, cv);
    int keep = 0;
    for (int i = 0; i < st.nseg; ++i) {
      const Segment s = st.seg[i];
      const int64_t here = std::min<int64_t>(s.len, kQuantBlock - s.off);
      CopyCodes(cm + s.off, here, s.m);
      CopyCodes(cv + s.off, here, s.v);
      if (here < s.len) {  // the straddling block: the rest moves to the front
        st.seg[keep++] = {0, static_cast<int32_t>(s.len - here), s.m + here, s.v + here};
      }
    }
    const int64_t rest = st.fill > kQuantBlock ? st.fill - kQuantBlock : 0;
    for (int64_t j = 0; j < rest; j += 16) {
      _mm512_store_ps(st.xm + j, _mm512_loadu_ps(st.xm + kQuantBlock + j));
      _mm512_store_ps(st.xv + j, _mm512_loadu_ps(st.xv + kQuantBlock + j));
    }
    st.nseg = keep;
    st.fill = rest;
  }
};

// A row whose update passed the guard: where its stores go, and its new values in the scratch.
template <typename T>
struct RowOut {
  T *var;
  uint8_t *mc, *vc;
  float *absmax_m, *absmax_v;
  const LaqScratch &s;
};

// Stores a row: var, absmax, and its quotients m / absmax_m, v / absmax_v appended to the staging
// buffer (searched 256 lanes at a time).
template <typename T, int kMode>
FUSEKIT_QUANT_VBMI HWY_INLINE void StoreRow(const LazyAdamQuantRowsArgs &a, const RowOut<T> &p,
                                            Staging &st, Searcher<kMode> &search) {
  const int64_t D = a.dim;
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int64_t lo = b * kLaqBlock, len = std::min(kLaqBlock, D - lo);
    const float max_m = p.s.max_m[b] + 0.0f, max_v = p.s.max_v[b] + 0.0f;
    p.absmax_m[b] = max_m;
    p.absmax_v[b] = max_v;
    const __m512 vdiv_m = _mm512_set1_ps(max_m == 0.0f ? 1.0f : max_m);
    const __m512 vdiv_v = _mm512_set1_ps(max_v == 0.0f ? 1.0f : max_v);
    float *xm = st.xm + st.fill, *xv = st.xv + st.fill;
    for (int64_t j = 0; j < len; j += 16) {
      StoreNarrowN(_mm512_loadu_ps(p.s.w + lo + j), p.var + lo + j, len - j);
      _mm512_storeu_ps(xm + j, _mm512_div_ps(_mm512_loadu_ps(p.s.m + lo + j), vdiv_m));
      _mm512_storeu_ps(xv + j, _mm512_div_ps(_mm512_loadu_ps(p.s.v + lo + j), vdiv_v));
    }
    st.seg[st.nseg++] = {static_cast<int32_t>(st.fill), static_cast<int32_t>(len), p.mc + lo,
                         p.vc + lo};
    st.fill += len;
    if (st.fill >= kQuantBlock) search.Flush(st);
  }
}

// The update's constants in registers.
struct UpdateConsts {
  __m512 b1, b2, omb1, omb2, eps, neg_lr;
  __m512i magnitude;
  bool guard_lost_v;
};

// The dequantized old v, with the lost-v guard where it is on (docs/fp8_state.md): m * m where v
// is 0 and m is not (a NaN m counts as not 0, as in the reference).
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 OldV(const UpdateConsts &c, __m512 m_old, __m512 v_old) {
  if (!c.guard_lost_v) return v_old;
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 lost =
      _mm512_cmp_ps_mask(v_old, zero, _CMP_EQ_OQ) & _mm512_cmp_ps_mask(m_old, zero, _CMP_NEQ_UQ);
  return _mm512_mask_mul_ps(v_old, lost, m_old, m_old);
}

// One vector of a row: `left` (1 to 16 and more) lanes from column j: LazyAdam's update of the
// dequantized m and v (qm, qv: the map entries, times the block's absmax), the new m, v and var
// into the scratch, the maxima (|m|, v, var's magnitude bits) over the valid lanes.
template <typename T>
FUSEKIT_QUANT_VBMI HWY_INLINE void UpdateVector(const UpdateConsts &c, __m512 qm, __m512 qv,
                                                __m512 vscale_m, __m512 vscale_v, const float *g,
                                                const T *var, int64_t left, const LaqScratch &s,
                                                int64_t j, __m512 &acc_m, __m512 &acc_v,
                                                __m512i &acc_w) {
  const __mmask16 lanes = LaneMask(left);
  const __m512 gj = LoadWideN(g + j, left);
  const __m512 m_old = _mm512_mul_ps(qm, vscale_m);
  const __m512 v_old = OldV(c, m_old, _mm512_mul_ps(qv, vscale_v));
  const __m512 m = _mm512_add_ps(_mm512_mul_ps(m_old, c.b1), _mm512_mul_ps(gj, c.omb1));
  const __m512 v = _mm512_abs_ps(
      _mm512_add_ps(_mm512_mul_ps(v_old, c.b2), _mm512_mul_ps(_mm512_mul_ps(gj, gj), c.omb2)));
  const __m512 w = _mm512_add_ps(
      LoadWideN(var + j, left),
      _mm512_div_ps(_mm512_mul_ps(m, c.neg_lr), _mm512_add_ps(_mm512_sqrt_ps(v), c.eps)));
  _mm512_storeu_ps(s.m + j, m);
  _mm512_storeu_ps(s.v + j, v);
  _mm512_storeu_ps(s.w + j, w);
  acc_m = _mm512_mask_max_ps(acc_m, lanes, _mm512_abs_ps(m), acc_m);
  acc_v = _mm512_mask_max_ps(acc_v, lanes, v, acc_v);
  acc_w = _mm512_mask_max_epi32(acc_w, lanes, _mm512_and_si512(_mm512_castps_si512(w), c.magnitude),
                                acc_w);
}

// A touched row: where it lives, and its gradient in float32.
template <typename T>
struct RowIn {
  T *var;
  uint8_t *mc, *vc;
  float *absmax_m, *absmax_v;
  const float *g;
};

// The next touched row of entries[k, end), k advanced past it (padding skipped; a repeated row's
// gradients summed into gbuf; a single float32 gradient row read where it is), prefetching the
// rows of the entry `ahead` on for every entry passed; false at the end.
template <typename T, typename G>
FUSEKIT_QUANT_VBMI HWY_INLINE bool NextRow(const LazyAdamQuantRowsArgs &a, int64_t &k, int64_t end,
                                           float *gbuf, RowIn<T> *out, int64_t D) {
  const int64_t ahead = a.prefetch_ahead;
  while (k < end) {
    if (k + ahead < end) {
      const uint64_t e = a.entries[k + ahead];
      const auto r = static_cast<int64_t>(e >> 32);
      if (e >> 32 < a.row_limit) {
        PrefetchLines(
            static_cast<const G *>(a.grad) + static_cast<int64_t>(e & 0xffffffffu) * a.grad_stride,
            D * static_cast<int64_t>(sizeof(G)));
        PrefetchLines(static_cast<const T *>(a.var) + r * a.var_stride,
                      D * static_cast<int64_t>(sizeof(T)));
        const uint8_t *mr = a.m + r * a.m_stride, *vr = a.v + r * a.v_stride;
        const float *amr = a.absmax_m + r * a.absmax_m_stride,
                    *avr = a.absmax_v + r * a.absmax_v_stride;
        PrefetchLines(mr, D);
        if (!SameLines(mr, vr, D)) PrefetchLines(vr, D);
        PrefetchLines(amr, a.blocks * 4);
        if (!SameLines(amr, avr, a.blocks * 4)) PrefetchLines(avr, a.blocks * 4);
      }
    }
    const uint64_t row = a.entries[k] >> 32;
    int64_t next = k + 1;
    while (next < end && (a.entries[next] >> 32) == row) ++next;
    if (row >= a.row_limit) {  // padding
      k = next;
      continue;
    }
    out->g = gbuf;
    if constexpr (sizeof(G) == 4) {
      if (next == k + 1) {  // one float32 gradient row: read where it is
        out->g = static_cast<const float *>(a.grad) +
                 static_cast<int64_t>(a.entries[k] & 0xffffffffu) * a.grad_stride;
      } else {
        SumGradient<G>(a, k, next, gbuf);
      }
    } else {
      SumGradient<G>(a, k, next, gbuf);
    }
    k = next;
    const auto r = static_cast<int64_t>(row);
    out->var = static_cast<T *>(a.var) + r * a.var_stride;
    out->mc = a.m + r * a.m_stride;
    out->vc = a.v + r * a.v_stride;
    out->absmax_m = a.absmax_m + r * a.absmax_m_stride;
    out->absmax_v = a.absmax_v + r * a.absmax_v_stride;
    return true;
  }
  return false;
}

// Rows of at most 32 columns (one block, at most two vectors), two at a time: the two rows' codes
// share one 64-code dequantization per map (a 32-code one costs nearly as much), and the two
// rows' independent chains (the square root and division, the maxima, the guard) are interleaved.
template <typename T, typename G, int kMode>
FUSEKIT_QUANT_VBMI HWY_INLINE int64_t SmallRows(const LazyAdamQuantRowsArgs &a,
                                                const BytePlanes &pm, const BytePlanes &pv,
                                                const UpdateConsts &c, __m512i var_limit,
                                                int64_t begin, int64_t end, Staging &st,
                                                Searcher<kMode> &search) {
  const hn::ScalableTag<float> df;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t D = a.dim;
  // The two rows' scratch (D <= 32: 32 floats and 16 more each).
  alignas(64) float buf[2][4][48];
  alignas(64) float maxima[2][2][16];
  const LaqScratch s[2] = {
      {buf[0][0], buf[0][1], buf[0][2], buf[0][3], maxima[0][0], maxima[0][1]},
      {buf[1][0], buf[1][1], buf[1][2], buf[1][3], maxima[1][0], maxima[1][1]}};
  int64_t skipped = 0;
  int64_t k = begin;
  RowIn<T> rows[2];
  while (NextRow<T, G>(a, k, end, buf[0][0], &rows[0], D)) {
    const int n = NextRow<T, G>(a, k, end, buf[1][0], &rows[1], D) ? 2 : 1;
    __m512 qm[4], qv[4];
    if (n == 2) {
      Dequant64(pm,
                _mm512_inserti64x4(LoadCodes(rows[0].mc, D),
                                   _mm512_castsi512_si256(LoadCodes(rows[1].mc, D)), 1),
                qm);
      Dequant64(pv,
                _mm512_inserti64x4(LoadCodes(rows[0].vc, D),
                                   _mm512_castsi512_si256(LoadCodes(rows[1].vc, D)), 1),
                qv);
    } else {
      Dequant32(pm, LoadCodes(rows[0].mc, D), qm);
      Dequant32(pv, LoadCodes(rows[0].vc, D), qv);
    }
    __m512 acc_m[2], acc_v[2];
    __m512i acc_w[2];
    for (int i = 0; i < n; ++i) {
      acc_m[i] = _mm512_setzero_ps();
      acc_v[i] = _mm512_setzero_ps();
      acc_w[i] = _mm512_setzero_si512();
    }
    for (int64_t j = 0; j < D; j += 16) {
      for (int i = 0; i < n; ++i) {
        const RowIn<T> &r = rows[i];
        UpdateVector(c, qm[2 * i + j / 16], qv[2 * i + j / 16], _mm512_set1_ps(r.absmax_m[0]),
                     _mm512_set1_ps(r.absmax_v[0]), r.g, r.var, D - j, s[i], j, acc_m[i], acc_v[i],
                     acc_w[i]);
      }
    }
    for (int i = 0; i < n; ++i) {
      const float max_m = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_m[i]}));
      const float max_v = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_v[i]}));
      s[i].max_m[0] = max_m;
      s[i].max_v[0] = max_v;
      if (!(max_m < kInf && max_v < kInf) || _mm512_cmpge_epi32_mask(acc_w[i], var_limit) != 0) {
        ++skipped;
        continue;
      }
      const RowIn<T> &r = rows[i];
      StoreRow(a, RowOut<T>{r.var, r.mc, r.vc, r.absmax_m, r.absmax_v, s[i]}, st, search);
    }
  }
  return skipped;
}

// ---- rows of at most 32 columns with the 16-bit search: the row's values stay in registers ----
// (kSlotVecs = 1: D <= 16; 2: D <= 32.) Rows go two at a time through the dequantization (one
// 32- or 64-code lookup per map for both), LazyAdam's update, the maxima (both rows' four reduced
// together) and the guard, all in registers; var and absmax are stored at once and the quotients
// m / absmax, v / absmax written to one slot of a tile of 256 lanes per map. A full tile runs one
// 16-bit search for both maps (eight chains per level) straight from the tile, and each slot's
// codes go from the register to the row they belong to: nothing else is staged.
template <int kSlotVecs>
struct Tile {
  static constexpr int kSlotLanes = 16 * kSlotVecs, kSlots = kQuantBlock / kSlotLanes;
  alignas(64) float xm[kQuantBlock], xv[kQuantBlock];  // the new m and v; then m / dm, v / dv
  alignas(64) float dm[kSlots], dv[kSlots];  // the slot's divisors (absmax, 1 for an absmax of 0)
  uint8_t *mc[kSlots], *vc[kSlots];          // where a slot's codes go (null: a skipped row's slot)
  int n = 0;                                 // slots filled
};

// D (1 to 16 kSlotVecs) codes of slot `slot` of the 64 in `codes` (kSlotVecs = 2: slots of 32
// bytes, two per vector; 1: slots of 16, four per vector) to p, within the row's cache lines.
template <int kSlotVecs>
FUSEKIT_QUANT_VBMI HWY_INLINE void StoreSlotCodes(__m512i codes, int slot, int64_t D, uint8_t *p) {
  if constexpr (kSlotVecs == 2) {
    const __m256i c =
        slot == 0 ? _mm512_castsi512_si256(codes) : _mm512_extracti64x4_epi64(codes, 1);
    if (D == 32) {
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), c);
    } else if (WithinLines(p, D, 32)) {
      _mm256_mask_storeu_epi8(p, static_cast<__mmask32>(ByteMask(D)), c);
    } else {
      alignas(32) uint8_t tmp[32];
      _mm256_store_si256(reinterpret_cast<__m256i *>(tmp), c);
      for (int64_t j = 0; j < D; ++j) p[j] = tmp[j];
    }
  } else {
    __m128i c;
    switch (slot) {
      case 0:
        c = _mm512_castsi512_si128(codes);
        break;
      case 1:
        c = _mm512_extracti32x4_epi32(codes, 1);
        break;
      case 2:
        c = _mm512_extracti32x4_epi32(codes, 2);
        break;
      default:
        c = _mm512_extracti32x4_epi32(codes, 3);
        break;
    }
    if (D == 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i *>(p), c);
    } else if (WithinLines(p, D, 16)) {
      _mm_mask_storeu_epi8(p, static_cast<__mmask16>(ByteMask(D)), c);
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i *>(tmp), c);
      for (int64_t j = 0; j < D; ++j) p[j] = tmp[j];
    }
  }
}

// Searches the tile (both maps, 128 lanes of each per pass) and stores the codes of its slots.
template <int kSlotVecs, bool kSignFix>
FUSEKIT_QUANT_VBMI HWY_NOINLINE void FlushTile(const Search16Tables &sm, const Search16Tables &sv,
                                               int64_t D, Tile<kSlotVecs> &t) {
  using TileT = Tile<kSlotVecs>;
  if (t.n == 0) return;
  for (int i = t.n; i < TileT::kSlots; ++i) {
    t.mc[i] = t.vc[i] = nullptr;
    t.dm[i] = t.dv[i] = 1.0f;
  }
  const Search16Tables *s[8] = {&sm, &sm, &sm, &sm, &sv, &sv, &sv, &sv};
  float *x_of[2] = {t.xm, t.xv};
  const float *d_of[2] = {t.dm, t.dv};
  for (int j0 = 0; j0 < kQuantBlock; j0 += 128) {
    __m512i h[8], r[8];
    for (int p = 0; p < 2; ++p) {
      for (int k = 0; k < 4; ++k) {
        float *x = x_of[p] + j0 + 32 * k;
        __m512 q[2];
        for (int u = 0; u < 2; ++u) {
          const int slot = static_cast<int>((j0 + 32 * k + 16 * u) / TileT::kSlotLanes);
          q[u] =
              SearchValue(_mm512_div_ps(_mm512_load_ps(x + 16 * u), _mm512_set1_ps(d_of[p][slot])));
          _mm512_store_ps(x + 16 * u, q[u]);
        }
        h[4 * p + k] = BucketNumbers(q[0], q[1]);
      }
    }
    Search16N<8>(s, h, r);
    for (int p = 0; p < 2; ++p) {
      for (int k = 0; k < 2; ++k) {
        const int64_t lo = j0 + 64 * k;
        __m512 x[4];
        for (int q = 0; q < 4; ++q) x[q] = _mm512_load_ps(x_of[p] + lo + 16 * q);
        const __m512i codes = CodesOfPaths<kSignFix>(
            p == 0 ? sm : sv, PackPaths(r[4 * p + 2 * k], r[4 * p + 2 * k + 1]), x);
        for (int q = 0; q < 64 / TileT::kSlotLanes; ++q) {
          const int slot = static_cast<int>(lo / TileT::kSlotLanes) + q;
          uint8_t *dst = p == 0 ? t.mc[slot] : t.vc[slot];
          if (dst != nullptr) StoreSlotCodes<kSlotVecs>(codes, q, D, dst);
        }
      }
    }
  }
  t.n = 0;
}

// The maxima of four vectors at once: lane 4 i of the result is the largest lane of a[i]
// (order-free: the values are non-negative, and a NaN makes its row's var NaN, so the guard skips
// the row whatever the maxima say).
FUSEKIT_QUANT_VBMI HWY_INLINE __m512 Max4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 x01 =
      _mm512_max_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
  const __m512 x23 =
      _mm512_max_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
  __m512 x =
      _mm512_max_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4e));
  return _mm512_max_ps(x, _mm512_permute_ps(x, 0xb1));
}

// n (16 or 32) codes at p, as the low bytes of a vector.
template <int kBytes>
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i LoadFullCodes(const uint8_t *p) {
  if constexpr (kBytes == 32) {
    return _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
  } else {
    return _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
  }
}

// A row's D codes: the full-width load (kFull: D == kBytes), else the masked one.
template <bool kFull, int kBytes>
FUSEKIT_QUANT_VBMI HWY_INLINE __m512i RowCodes(const uint8_t *p, int64_t D) {
  if constexpr (kFull) {
    return LoadFullCodes<kBytes>(p);
  } else {
    return LoadCodes(p, D);
  }
}

// kFull: D is exactly 16 kSlotVecs (the common widths 16 and 32: no masks, no tails).
template <typename T, typename G, int kSlotVecs, bool kSignFix, bool kFull>
FUSEKIT_QUANT_VBMI HWY_INLINE int64_t TileRows(const LazyAdamQuantRowsArgs &a, const BytePlanes &pm,
                                               const BytePlanes &pv, const Search16Tables &sm,
                                               const Search16Tables &sv, const UpdateConsts &c,
                                               __m512i var_limit, int64_t begin, int64_t end) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int kL = 16 * kSlotVecs;  // lanes per slot
  const int64_t D = kFull ? kL : a.dim;

  const __mmask16 last = LaneMask(D - 16 * (kSlotVecs - 1));  // valid lanes of a row's last vector
  alignas(64) float gbuf[2][kL + 16];
  Tile<kSlotVecs> tile;
  int64_t skipped = 0;
  int64_t k = begin;
  RowIn<T> rows[2];
  while (NextRow<T, G>(a, k, end, gbuf[0], &rows[0], D)) {
    const int n = NextRow<T, G>(a, k, end, gbuf[1], &rows[1], D) ? 2 : 1;
    if (n == 1) rows[1] = rows[0];  // computed twice, stored once
    // Both rows' codes in one vector per map: row 0 in the low half, row 1 in the high half.
    __m512 qm[4], qv[4];
    const __m512i cm0 = RowCodes<kFull, kL>(rows[0].mc, D),
                  cm1 = RowCodes<kFull, kL>(rows[1].mc, D);
    const __m512i cv0 = RowCodes<kFull, kL>(rows[0].vc, D),
                  cv1 = RowCodes<kFull, kL>(rows[1].vc, D);
    if constexpr (kSlotVecs == 2) {
      Dequant64(pm, _mm512_inserti64x4(cm0, _mm512_castsi512_si256(cm1), 1), qm);
      Dequant64(pv, _mm512_inserti64x4(cv0, _mm512_castsi512_si256(cv1), 1), qv);
    } else {
      Dequant32(pm, _mm512_inserti32x4(cm0, _mm512_castsi512_si128(cm1), 1), qm);
      Dequant32(pv, _mm512_inserti32x4(cv0, _mm512_castsi512_si128(cv1), 1), qv);
    }
    __m512 m[2][kSlotVecs], v[2][kSlotVecs], w[2][kSlotVecs];
    __m512 am[2], av[2];
    for (int i = 0; i < 2; ++i) {
      const RowIn<T> &r = rows[i];
      const __m512 sm_i = _mm512_set1_ps(r.absmax_m[0]), sv_i = _mm512_set1_ps(r.absmax_v[0]);
      for (int q = 0; q < kSlotVecs; ++q) {
        const int64_t j = 16 * q;
        const bool tail = q == kSlotVecs - 1;
        const __m512 gj = tail ? LoadWideN(r.g + j, D - j) : Widen(r.g + j);
        const __m512 var = tail ? LoadWideN(r.var + j, D - j) : Widen(r.var + j);
        const __m512 m_old = _mm512_mul_ps(qm[kSlotVecs * i + q], sm_i);
        const __m512 v_old = OldV(c, m_old, _mm512_mul_ps(qv[kSlotVecs * i + q], sv_i));
        m[i][q] = _mm512_add_ps(_mm512_mul_ps(m_old, c.b1), _mm512_mul_ps(gj, c.omb1));
        v[i][q] = _mm512_abs_ps(_mm512_add_ps(_mm512_mul_ps(v_old, c.b2),
                                              _mm512_mul_ps(_mm512_mul_ps(gj, gj), c.omb2)));
        w[i][q] = _mm512_add_ps(var, _mm512_div_ps(_mm512_mul_ps(m[i][q], c.neg_lr),
                                                   _mm512_add_ps(_mm512_sqrt_ps(v[i][q]), c.eps)));
      }
      // |m| and v over the valid lanes (zero past D).
      __m512 mm =
          _mm512_maskz_mov_ps(kSlotVecs == 1 ? last : __mmask16{0xffff}, _mm512_abs_ps(m[i][0]));
      __m512 mv = _mm512_maskz_mov_ps(kSlotVecs == 1 ? last : __mmask16{0xffff}, v[i][0]);
      if constexpr (kSlotVecs == 2) {
        mm = _mm512_max_ps(mm, _mm512_maskz_mov_ps(last, _mm512_abs_ps(m[i][1])));
        mv = _mm512_max_ps(mv, _mm512_maskz_mov_ps(last, v[i][1]));
      }
      am[i] = mm;
      av[i] = mv;
    }
    // The maxima stay in vector registers: lane 4 j of mx is row j / 2's (m for even j, v for
    // odd), each plus +0 (as the other kernels: -0 as +0); the divisors are the maxima with 0 as
    // 1; the guard's maxima test is one compare for both rows.
    const __m512 mx = _mm512_add_ps(Max4(am[0], av[0], am[1], av[1]), _mm512_setzero_ps());
    const __m512 dx = _mm512_mask_mov_ps(
        mx, _mm512_cmp_ps_mask(mx, _mm512_setzero_ps(), _CMP_EQ_OQ), _mm512_set1_ps(1.0f));
    const __mmask16 finite = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(kInf), _CMP_LT_OQ);
    for (int i = 0; i < n; ++i) {
      const RowIn<T> &r = rows[i];
      // The guard: the maxima finite, and var as stored finite in every valid lane.
      __mmask16 bad = 0;
      for (int q = 0; q < kSlotVecs; ++q) {
        bad |= _mm512_mask_cmpge_epi32_mask(
            q == kSlotVecs - 1 ? last : __mmask16{0xffff},
            _mm512_and_si512(_mm512_castps_si512(w[i][q]), c.magnitude), var_limit);
      }
      const int slot = tile.n++;
      // Row i's m and v maxima in lane 0 of these (the extracts take immediates only).
      const __m128 max_m = i == 0 ? _mm512_extractf32x4_ps(mx, 0) : _mm512_extractf32x4_ps(mx, 2);
      const __m128 max_v = i == 0 ? _mm512_extractf32x4_ps(mx, 1) : _mm512_extractf32x4_ps(mx, 3);
      const __m128 div_m = i == 0 ? _mm512_extractf32x4_ps(dx, 0) : _mm512_extractf32x4_ps(dx, 2);
      const __m128 div_v = i == 0 ? _mm512_extractf32x4_ps(dx, 1) : _mm512_extractf32x4_ps(dx, 3);
      const unsigned both = 0x11u << (8 * i);  // lanes 8 i and 8 i + 4 of `finite`
      if ((static_cast<unsigned>(finite) & both) != both || bad != 0) {
        ++skipped;
        tile.mc[slot] = tile.vc[slot] = nullptr;
      } else {
        for (int q = 0; q < kSlotVecs; ++q) StoreNarrowN(w[i][q], r.var + 16 * q, D - 16 * q);
        _mm_store_ss(r.absmax_m, max_m);
        _mm_store_ss(r.absmax_v, max_v);
        tile.mc[slot] = r.mc;
        tile.vc[slot] = r.vc;
      }
      _mm_store_ss(tile.dm + slot, div_m);
      _mm_store_ss(tile.dv + slot, div_v);
      for (int q = 0; q < kSlotVecs; ++q) {
        _mm512_store_ps(tile.xm + kL * slot + 16 * q, m[i][q]);
        _mm512_store_ps(tile.xv + kL * slot + 16 * q, v[i][q]);
      }
      if (tile.n == Tile<kSlotVecs>::kSlots) FlushTile<kSlotVecs, kSignFix>(sm, sv, D, tile);
    }
  }
  FlushTile<kSlotVecs, kSignFix>(sm, sv, D, tile);
  return skipped;
}

template <typename T, typename G, int kMode>
FUSEKIT_QUANT_VBMI HWY_NOINLINE int64_t FastRows(const LazyAdamQuantRowsArgs &a,
                                                 const VbmiTables &pt, int64_t begin, int64_t end,
                                                 void *scratch_mem) {
  const hn::ScalableTag<float> df;
  // The maps' byte planes are read where they are, as memory operands of the permutes: copied
  // into locals (as ApplyAdamWQuant's kernel does for its blocks of 256), GCC keeps all 32
  // registers of them live across a row's block loop and spills and reloads them once per row,
  // which at D = 32 cost more than the row's arithmetic. The search tables, used once per 256
  // lanes, are copied (Searcher).
  const BytePlanes &pm = pt.pm, &pv = pt.pv;
  const UpdateConsts c{_mm512_set1_ps(a.beta1),           _mm512_set1_ps(a.beta2),
                       _mm512_set1_ps(a.one_minus_beta1), _mm512_set1_ps(a.one_minus_beta2),
                       _mm512_set1_ps(a.epsilon),         _mm512_set1_ps(a.neg_lr),
                       _mm512_set1_epi32(0x7fffffff),     a.guard_lost_v};
  const __m512i var_limit = _mm512_set1_epi32(static_cast<int32_t>(adam_stored_finite_limit<T>()));
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int64_t skipped = 0;
  const int64_t D = a.dim;
  // The tile path for the common maps (the 16-bit search without m's sign fix); one
  // instantiation without masks for the seed's D = 32. (Maps where the sign fix acts, or whose
  // thresholds share buckets, take the staged path below: fewer instantiations to compile.)
  if (kMode == 1 && D <= 32) {
    const Search16Tables &sm = pt.s16_m, &sv = pt.s16_v;
    if (D == 32) return TileRows<T, G, 2, false, true>(a, pm, pv, sm, sv, c, var_limit, begin, end);
    if (D <= 16)
      return TileRows<T, G, 1, false, false>(a, pm, pv, sm, sv, c, var_limit, begin, end);
    return TileRows<T, G, 2, false, false>(a, pm, pv, sm, sv, c, var_limit, begin, end);
  }
  Searcher<kMode> search;
  search.map_m = &a.map_m;
  if constexpr (kMode > 0) {
    search.s16_m = pt.s16_m;
    search.s16_v = pt.s16_v;
  } else {
    search.search_m = pt.search_m;
    search.search_v = pt.search_v;
  }
  Staging st;
  if (D <= 32) {
    skipped = SmallRows<T, G, kMode>(a, pm, pv, c, var_limit, begin, end, st, search);
  } else {
    const LaqScratch s = laq_scratch(scratch_mem, D);
    int64_t k = begin;
    RowIn<T> r;
    while (NextRow<T, G>(a, k, end, s.g, &r, D)) {
      // (1) Per block: dequantize, update into the scratch, the maxima; nothing is stored yet.
      __m512i acc_w = _mm512_setzero_si512();
      bool maxima_ok = true;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const int64_t lo = b * kLaqBlock, len = std::min(kLaqBlock, D - lo);
        const __m512 vscale_m = _mm512_set1_ps(r.absmax_m[b]);
        const __m512 vscale_v = _mm512_set1_ps(r.absmax_v[b]);
        __m512 acc_m = _mm512_setzero_ps(), acc_v = _mm512_setzero_ps();
        for (int64_t j0 = 0; j0 < len; j0 += 64) {
          const int64_t bytes = std::min<int64_t>(64, len - j0);
          __m512 qm[4], qv[4];
          if (bytes <= 32) {
            Dequant32(pm, LoadCodes(r.mc + lo + j0, bytes), qm);
            Dequant32(pv, LoadCodes(r.vc + lo + j0, bytes), qv);
          } else {
            Dequant64(pm, LoadCodes(r.mc + lo + j0, bytes), qm);
            Dequant64(pv, LoadCodes(r.vc + lo + j0, bytes), qv);
          }
          for (int q = 0; q < 4; ++q) {
            const int64_t j = lo + j0 + 16 * q;
            if (j >= lo + len) break;
            UpdateVector(c, qm[q], qv[q], vscale_m, vscale_v, r.g, r.var, lo + len - j, s, j, acc_m,
                         acc_v, acc_w);
          }
        }
        const float max_m = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_m}));
        const float max_v = hn::GetLane(hn::MaxOfLanes(df, hn::Vec512<float>{acc_v}));
        s.max_m[b] = max_m;
        s.max_v[b] = max_v;
        maxima_ok = maxima_ok && max_m < kInf && max_v < kInf;
      }
      // (2) The guard (as the other kernels: var's largest magnitude bits and the maxima).
      if (!maxima_ok || _mm512_cmpge_epi32_mask(acc_w, var_limit) != 0) {
        ++skipped;
        continue;
      }
      // (3) var and absmax stored, the quotients staged for the codes.
      StoreRow(a, RowOut<T>{r.var, r.mc, r.vc, r.absmax_m, r.absmax_v, s}, st, search);
    }
  }
  search.Flush(st);
  if (st.nseg > 0) search.Flush(st);  // a block that straddled the last full buffer
  return skipped;
}

template <typename T, typename G>
int64_t RowsOf(const LazyAdamQuantRowsArgs &a, const VbmiTables &t, int64_t begin, int64_t end,
               void *scratch) {
  switch (t.mode) {
    case 2:
      return FastRows<T, G, 2>(a, t, begin, end, scratch);
    case 1:
      return FastRows<T, G, 1>(a, t, begin, end, scratch);
    default:
      return FastRows<T, G, 0>(a, t, begin, end, scratch);
  }
}

int64_t LazyAdamQuantRowsVbmi(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end,
                              void *scratch) {
  if (a.prepared == nullptr) {  // not prepared by the run: the tables of this call only
    alignas(64) unsigned char local[kQuantVbmiTablesBytes];
    PrepareTables(a.map_m, a.map_v, local);
    LazyAdamQuantRowsArgs b = a;
    b.prepared = local;
    return LazyAdamQuantRowsVbmi(b, begin, end, scratch);
  }
  const auto &t = *static_cast<const VbmiTables *>(a.prepared);
  const bool f32_grad = a.grad_dtype == DType::kFloat32;
  switch (a.dtype) {
    case DType::kFloat16:
      return f32_grad ? RowsOf<float16_t, float>(a, t, begin, end, scratch)
                      : RowsOf<float16_t, float16_t>(a, t, begin, end, scratch);
    case DType::kBFloat16:
      return f32_grad ? RowsOf<bfloat16_t, float>(a, t, begin, end, scratch)
                      : RowsOf<bfloat16_t, bfloat16_t>(a, t, begin, end, scratch);
    default:
      return RowsOf<float, float>(a, t, begin, end, scratch);
  }
}

void PrepareLaqVbmi(const QuantMapTables &m, const QuantMapTables &v, void *out) {
  PrepareTables(m, v, out);
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // HWY_ARCH_X86

fusekit::QuantVbmiKernel<fusekit::LazyAdamQuantRowsFn> fusekit::lazy_adam_quant_avx512vbmi() {
#if HWY_ARCH_X86
  return {&HWY_NAMESPACE::LazyAdamQuantRowsVbmi, &HWY_NAMESPACE::PrepareLaqVbmi};
#else
  return {};
#endif
}
