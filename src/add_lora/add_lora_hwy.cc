// AddLora, the optimized kernel: Highway SIMD, compiled for every x86 target Highway builds and
// dispatched at run time, as work items (add_lora_kernels.h) that the driver in add_lora_cpu.cc
// runs on the thread layer over groups, rows and output columns.
//
// Prefill path (a group of many rows on one adapter), per group:
//   1. pack weightA^T to a float32 panel [H1, R16] and weightB^T to column tiles [H2/TW][R][TW]
//      (threads split k and the column tiles);
//   2. shrink: t = x . A^T for tiles of kMR rows x kNV rank vectors, each x element broadcast
//      against a vector of the panel, accumulated by FMA in k order (threads split row blocks);
//   3. expand: tiles of kMR rows x TW columns, acc = sum over r of t[m, r] * Bt[r, cols] by FMA in
//      r order; out = round(y + scale * acc) once (threads split row panels x column blocks).
// Decode path (up to a few dozen rows per adapter, nothing packed):
//   shrink: register tiles of kSR rows x kSQ ranks, one vector chain per pair over H1 (x and A
//      widened as loaded), reduced across lanes;
//   expand: per N output columns, weightB's [N columns, N ranks] blocks transposed in registers,
//      then tiles of up to kDR rows: acc = sum over r of t[m, r] * B^T[r, cols] by FMA in r order,
//      out = round(y + scale * acc): the prefill expand's operations in its order.
//
// Every output element is computed by one chunk, by the same operations in the same order for
// any thread count, so results are bitwise identical for every thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "add_lora/add_lora_hwy.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "add_lora/add_lora_kernels.h"
#include "common/float_types.h"
#include "fusekit/float16.h"
// Per target (a Highway -inl.h header): LoadWide, StoreNarrow.
#include "common/hwy_dispatch.h"
#include "common/hwy_dtype-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// Everything here in its own namespace: other operators' per-target helpers have the same names.
namespace lora {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_TARGET <= HWY_AVX3
constexpr int kMR = 6;  // rows per register tile
constexpr int kNV = 4;  // vectors per register tile (24 accumulators of 32 registers)
#else
constexpr int kMR = 4;
constexpr int kNV = 2;  // 8 accumulators of 16 registers
#endif
constexpr int64_t kKChunk = 64;           // k per packing item of weightA
constexpr int64_t kXChunk = 256;          // columns per chunk of a packed block of x rows
constexpr int64_t kRowPanelTiles = 8;     // row tiles per expand item
constexpr int64_t kShrinkItemBlocks = 8;  // row blocks per shrink item
constexpr int64_t kColBlockCols = 1024;   // output columns per expand item (a multiple of any tile)
constexpr int64_t kDecodeRanks = 8;       // ranks per decode shrink item
constexpr int64_t kDecodeCols = 256;      // output columns per decode expand item
#if HWY_TARGET <= HWY_AVX3
constexpr int kSR = 4;  // decode shrink register tile: rows
constexpr int kDR = 8;  // decode expand register tile: rows
#else
constexpr int kSR = 2;
constexpr int kDR = 4;
#endif
constexpr int kSQ = 4;  // decode shrink register tile: ranks
// Whether this target's vectors can be transposed in registers (a fixed width of 1, 4, 8 or 16
// float lanes in 128-bit blocks): the decode expand then serves N columns per broadcast FMA;
// otherwise (scalable vectors) it takes a dot product per output element.
#if HWY_HAVE_SCALABLE
constexpr bool kTransposes = false;
#else
constexpr bool kTransposes = hn::MaxLanes(DF()) == 1 || hn::MaxLanes(DF()) == 4 ||
                             hn::MaxLanes(DF()) == 8 || hn::MaxLanes(DF()) == 16;
#endif

// Loads and stores of the three element types as float32 lanes: LoadWide and StoreNarrow
// (common/hwy_dtype-inl.h; the 16-bit stores round to nearest even on every target).

template <typename T>
HWY_INLINE void ConvertRow(const T *src, float *dst, int64_t n) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadWide(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

// out = round(y + scale * z) for n columns, z in float32.
template <typename T>
HWY_INLINE void EpilogueRow(const float *z, const T *y, T *out, int64_t n, float scale) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  int64_t j = 0;
  for (; j + N <= n; j += N)
    StoreNarrow(d, hn::Add(LoadWide(d, y + j), hn::Mul(vs, hn::LoadU(d, z + j))), out + j);
  for (; j < n; ++j) out[j] = from_float<T>(to_float(y[j]) + scale * z[j]);
}

// ---- prefill: packing ----

// at[k * ts + r] = A[r, k] for k in [k0, k0 + kn), zero for r in [R, ts).
template <typename T>
void PackAChunk(const T *A, int64_t ars, int64_t R, int64_t ts, int64_t k0, int64_t kn, float *at,
                float *tmp) {
  for (int64_t r = 0; r < R; ++r) ConvertRow(A + r * ars + k0, tmp + r * kKChunk, kn);
  for (int64_t i = 0; i < kn; ++i) {
    float *dst = at + (k0 + i) * ts;
    for (int64_t r = 0; r < R; ++r) dst[r] = tmp[r * kKChunk + i];
    for (int64_t r = R; r < ts; ++r) dst[r] = 0.0f;
  }
}

// Column tile ct of weightB^T: bt[ct * R * TW + r * TW + c] = B[ct * TW + c, r], zero past H2.
template <typename T>
void PackBTile(const T *B, int64_t brs, int64_t R, int64_t ts, int64_t h2, int64_t tw, int64_t ct,
               float *bt, float *tmp) {
  const int64_t j0 = ct * tw;
  const int64_t cn = std::min(tw, h2 - j0);
  for (int64_t c = 0; c < cn; ++c) ConvertRow(B + (j0 + c) * brs, tmp + c * ts, R);
  float *tile = bt + ct * R * tw;
  for (int64_t r = 0; r < R; ++r) {
    float *dst = tile + r * tw;
    for (int64_t c = 0; c < cn; ++c) dst[c] = tmp[c * ts + r];
    for (int64_t c = cn; c < tw; ++c) dst[c] = 0.0f;
  }
}

// ---- prefill: register tiles ----

// t rows tr[m][r0 .. r0 + NV*N) (+)= sum over k in [0, kn) of x[m][k] * at[k][r0 ..], k in order,
// continuing from the partial sums already in t when `accumulate`. xp holds the kMR rows of this
// k-range in chunks of kXChunk columns (xp[((k / kXChunk) * kMR + m) * kXChunk + k % kXChunk]), so
// that within a chunk the broadcasts are fixed offsets of one pointer.
// `next` (kMR row pointers at column k0, or null) are the next block's rows of x: one cache line
// of each is prefetched (to L2) every 64 bytes of k, spread over the tile's FMAs.
template <int NV, typename T>
HWY_INLINE void ShrinkTile(const float *HWY_RESTRICT xp, int64_t kn, const float *HWY_RESTRICT at,
                           int64_t ts, int64_t r0, float *const *tr, int nrows, bool accumulate,
                           const T *const *next) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[kMR][NV];
  for (int m = 0; m < kMR; ++m) {
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? hn::Load(d, tr[m] + r0 + v * N) : hn::Zero(d);
  }
  const float *a = at + r0;
  for (int64_t c0 = 0; c0 < kn; c0 += kXChunk, xp += kMR * kXChunk) {
    const int64_t cn = std::min(kXChunk, kn - c0);
    for (int64_t kk = 0; kk < cn; ++kk, a += ts) {
      if (next != nullptr && kk % kLine == 0) {
        for (int m = 0; m < kMR; ++m) __builtin_prefetch(next[m] + c0 + kk, 0, 2);
      }
      VF bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = hn::Load(d, a + v * N);
      for (int m = 0; m < kMR; ++m) {
        const VF xb = hn::Set(d, xp[m * kXChunk + kk]);
        for (int v = 0; v < NV; ++v) acc[m][v] = hn::MulAdd(xb, bv[v], acc[m][v]);
      }
    }
  }
  for (int m = 0; m < nrows; ++m) {
    for (int v = 0; v < NV; ++v) hn::Store(acc[m][v], d, tr[m] + r0 + v * N);
  }
}

// Converts columns [k0, k0 + kn) of kMR rows of x (row pointers; padding rows repeat row 0) to
// float32 in the chunked layout ShrinkTile reads.
template <typename T>
HWY_INLINE void PackXBlock(const T *const *xr, int64_t k0, int64_t kn, float *HWY_RESTRICT xp) {
  for (int64_t c0 = 0; c0 < kn; c0 += kXChunk, xp += kMR * kXChunk) {
    const int64_t cn = std::min(kXChunk, kn - c0);
    for (int m = 0; m < kMR; ++m) ConvertRow(xr[m] + k0 + c0, xp + m * kXChunk, cn);
  }
}

// out[m][col0 ..] = round(y + scale * sum over r of t[m][r] * tile[r][..]) for a kMR x kNV*N tile.
template <typename T>
HWY_INLINE void ExpandTile(const float *const *tr, int nrows, const float *tile, int64_t R,
                           int64_t col0, int64_t h2, const T *const *yr, T *const *outr,
                           float scale, float *buf) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[kMR][kNV];
  for (int m = 0; m < kMR; ++m) {
    for (int v = 0; v < kNV; ++v) acc[m][v] = hn::Zero(d);
  }
  const float *b = tile;
  for (int64_t r = 0; r < R; ++r, b += kNV * N) {
    VF bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = hn::Load(d, b + v * N);
    for (int m = 0; m < kMR; ++m) {
      const VF tb = hn::Set(d, tr[m][r]);
      for (int v = 0; v < kNV; ++v) acc[m][v] = hn::MulAdd(tb, bv[v], acc[m][v]);
    }
  }
  const auto vs = hn::Set(d, scale);
  for (int m = 0; m < nrows; ++m) {
    for (int v = 0; v < kNV; ++v) {
      const int64_t j = col0 + v * N;
      if (j + N <= h2) {
        StoreNarrow(d, hn::Add(LoadWide(d, yr[m] + j), hn::Mul(vs, acc[m][v])), outr[m] + j);
      } else if (j < h2) {
        hn::StoreU(acc[m][v], d, buf);
        for (int64_t jj = j; jj < h2; ++jj)
          outr[m][jj] = from_float<T>(to_float(yr[m][jj]) + scale * buf[jj - j]);
      }
    }
  }
}

// ---- decode: register tiles, no packing ----

// sum over r of t[r] * b[r] for a short R: 8-lane chunks, reduced, then the scalar tail (the
// decode expand where vectors are not transposed in registers).
template <typename T>
HWY_INLINE float DotShort(const float *t, const T *b, int64_t n) {
  const hn::CappedTag<float, 8> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(d8));
  auto acc = hn::Zero(d8);
  int64_t r = 0;
  for (; r + N <= n; r += N) acc = hn::MulAdd(hn::LoadU(d8, t + r), LoadWide(d8, b + r), acc);
  float z = hn::GetLane(hn::SumOfLanes(d8, acc));
  for (; r < n; ++r) z = z + t[r] * to_float(b[r]);
  return z;
}

// v[0 .. N) (rows of an N x N block) become its columns: v[i] lane c = old v[c] lane i. Within
// each 128-bit block a 4 x 4 transpose by interleaves; then the blocks of four rows are
// transposed as 4 x 4 (16 lanes) or 2 x 2 (8 lanes) matrices of blocks.
template <size_t kN>
HWY_INLINE void TransposeSquare([[maybe_unused]] VF *v) {
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
  if constexpr (kN >= 4) {
    const DF d;
    const hn::Repartition<uint64_t, DF> d64;
    for (size_t g = 0; g < kN; g += 4) {
      const VF t0 = hn::InterleaveLower(d, v[g], v[g + 1]);
      const VF t1 = hn::InterleaveLower(d, v[g + 2], v[g + 3]);
      const VF t2 = hn::InterleaveUpper(d, v[g], v[g + 1]);
      const VF t3 = hn::InterleaveUpper(d, v[g + 2], v[g + 3]);
      v[g] = hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, t0), hn::BitCast(d64, t1)));
      v[g + 1] =
          hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, t0), hn::BitCast(d64, t1)));
      v[g + 2] =
          hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, t2), hn::BitCast(d64, t3)));
      v[g + 3] =
          hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, t2), hn::BitCast(d64, t3)));
    }
    // Now v[4g + i] block b = column 4b + i of rows 4g .. 4g + 3.
#if HWY_CAP_GE256
    if constexpr (kN == 8) {
      for (size_t i = 0; i < 4; ++i) {
        const VF lo = v[i], hi = v[4 + i];
        v[i] = hn::ConcatLowerLower(d, hi, lo);      // column i
        v[4 + i] = hn::ConcatUpperUpper(d, hi, lo);  // column 4 + i
      }
    }
#endif
#if HWY_CAP_GE512
    if constexpr (kN == 16) {
      for (size_t i = 0; i < 4; ++i) {
        const VF c0 = v[i], c1 = v[4 + i], c2 = v[8 + i], c3 = v[12 + i];
        const VF p = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(c1), c0);  // c0.b0 c1.b0 c0.b2 c1.b2
        const VF q = hn::OddEvenBlocks(c1, hn::SwapAdjacentBlocks(c0));  // c0.b1 c1.b1 c0.b3 c1.b3
        const VF s = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(c3), c2);
        const VF u = hn::OddEvenBlocks(c3, hn::SwapAdjacentBlocks(c2));
        v[i] = hn::ConcatLowerLower(d, s, p);       // column i
        v[4 + i] = hn::ConcatLowerLower(d, u, q);   // column 4 + i
        v[8 + i] = hn::ConcatUpperUpper(d, s, p);   // column 8 + i
        v[12 + i] = hn::ConcatUpperUpper(d, u, q);  // column 12 + i
      }
    }
#endif  // HWY_CAP_GE512
  }
#endif
}

// z[m][q] = sum over k of xr[m][k] * ar[q][k] for kSR rows and kSQ ranks: one vector chain per
// pair over the whole vectors of k, reduced, then the scalar tail in k order.
template <typename T>
HWY_INLINE void ShrinkDots(const T *const *xr, const T *const *ar, int64_t n,
                           float (&z)[kSR][kSQ]) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[kSR][kSQ];
  for (int m = 0; m < kSR; ++m) {
    for (int q = 0; q < kSQ; ++q) acc[m][q] = hn::Zero(d);
  }
  int64_t k = 0;
  for (; k + N <= n; k += N) {
    VF av[kSQ];
    for (int q = 0; q < kSQ; ++q) av[q] = LoadWide(d, ar[q] + k);
    for (int m = 0; m < kSR; ++m) {
      const VF xv = LoadWide(d, xr[m] + k);
      for (int q = 0; q < kSQ; ++q) acc[m][q] = hn::MulAdd(xv, av[q], acc[m][q]);
    }
  }
  for (int m = 0; m < kSR; ++m) {
    for (int q = 0; q < kSQ; ++q) {
      float s = hn::GetLane(hn::SumOfLanes(d, acc[m][q]));
      for (int64_t kk = k; kk < n; ++kk) s = s + to_float(xr[m][kk]) * to_float(ar[q][kk]);
      z[m][q] = s;
    }
  }
}

// ---- the driver ----

// One call's constants and the work items of its stages. Each item is a pure function of its
// index (and the worker's scratch buffer, whose contents never carry over from one item to
// another), so which thread runs it, and in which order, never changes what it computes.
template <typename T>
struct Driver {
  const AddLoraArgs &a;
  const AddLoraScratch &s;
  int64_t N, tw, R, h1, h2, ts;
  const T *x, *y;
  T *out;
  const T *wa, *wb;
  bool has_a;
  int64_t n_tiles, col_block_tiles, n_col_blocks, n_rank_vectors, kc, n_rank_chunks, n_dec_cols;

  Driver(const AddLoraArgs &args, const AddLoraScratch &scratch) : a(args), s(scratch) {
    const DF d;
    N = static_cast<int64_t>(hn::Lanes(d));
    tw = kNV * N;  // columns per expand tile
    R = a.r;
    h1 = a.h1;
    h2 = a.h2;
    ts = s.t_stride;
    x = static_cast<const T *>(a.x);
    y = static_cast<const T *>(a.y);
    out = static_cast<T *>(a.out);
    wa = static_cast<const T *>(a.wa);
    wb = static_cast<const T *>(a.wb);
    has_a = wa != nullptr;
    n_tiles = (h2 + tw - 1) / tw;
    col_block_tiles = kColBlockCols / tw;
    n_col_blocks = (n_tiles + col_block_tiles - 1) / col_block_tiles;
    n_rank_vectors = ts / N;
    // k per shrink chunk: a multiple of kXChunk with kc x R16 floats <= 256 KiB.
    kc = std::max<int64_t>(kXChunk, 65536 / ts / kXChunk * kXChunk);
    n_rank_chunks = (R + kDecodeRanks - 1) / kDecodeRanks;
    n_dec_cols = (h2 + kDecodeCols - 1) / kDecodeCols;
  }

  float *Buf(int worker) const {
    return reinterpret_cast<float *>(s.per_thread +
                                     static_cast<size_t>(worker) * s.per_thread_bytes);
  }

  // ---- prefill, one group of n rows from g0 in the sorted order ----

  int64_t PackAItems() const { return has_a ? (h1 + kKChunk - 1) / kKChunk : 0; }

  // Item c < PackAItems(): a k-chunk of the weightA^T panel; after that, a column tile of
  // weightB^T.
  void PackItem(int64_t ad, int64_t c, float *buf) const {
    const int64_t n_a = PackAItems();
    if (c < n_a) {
      PackAChunk(wa + ad * a.wa_adapter_stride, a.wa_row_stride, R, ts, c * kKChunk,
                 std::min(kKChunk, h1 - c * kKChunk), s.a_panel, buf);
    } else {
      PackBTile(wb + ad * a.wb_adapter_stride, a.wb_row_stride, R, ts, h2, tw, c - n_a, s.b_panel,
                buf);
    }
  }

  // Shrink, kMR rows at a time, in items of kShrinkItemBlocks row blocks. Inside an item the k
  // range is cut into chunks of kc columns, outermost, so that a chunk of the A panel
  // (kc x R16 floats, at most 256 KiB) stays in this core's L2 while the item's row blocks pass
  // it; between chunks the partial sums wait in t (float32, exactly as they were in the
  // register), so each element is still one FMA chain in k order.
  void ShrinkItem(int64_t g0, int64_t n, int64_t item, float *buf) const {
    const int64_t n_blocks = (n + kMR - 1) / kMR;
    const int64_t b_lo = item * kShrinkItemBlocks,
                  b_hi = std::min(n_blocks, b_lo + kShrinkItemBlocks);
    for (int64_t k0 = 0; k0 < h1; k0 += kc) {
      const int64_t kn = std::min(kc, h1 - k0);
      for (int64_t blk = b_lo; blk < b_hi; ++blk) {
        const int nrows = static_cast<int>(std::min<int64_t>(kMR, n - blk * kMR));
        float *tr[kMR];
        const T *xr[kMR];
        for (int m = 0; m < kMR; ++m) {
          const int64_t k = g0 + blk * kMR + (m < nrows ? m : 0);
          tr[m] = s.t + k * ts;
          xr[m] = x + static_cast<int64_t>(a.rows[k]) * a.x_stride;
        }
        if (!has_a) {  // t = x
          for (int m = 0; m < nrows; ++m) ConvertRow(xr[m] + k0, tr[m] + k0, kn);
          continue;
        }
        PackXBlock(xr, k0, kn, buf);
        // The next block's rows (the item's last block: none), prefetched during the first tile.
        const T *next[kMR];
        const bool has_next = blk + 1 < b_hi;
        for (int m = 0; m < kMR && has_next; ++m) {
          const int64_t k = g0 + (blk + 1) * kMR + std::min<int64_t>(m, n - (blk + 1) * kMR - 1);
          next[m] = x + static_cast<int64_t>(a.rows[k]) * a.x_stride + k0;
        }
        const float *at = s.a_panel + k0 * ts;
        for (int64_t v0 = 0; v0 < n_rank_vectors; v0 += kNV) {
          const int64_t r0 = v0 * N;
          const T *const *pf = has_next && v0 == 0 ? next : nullptr;
          switch (std::min<int64_t>(kNV, n_rank_vectors - v0)) {
            case 1:
              ShrinkTile<1>(buf, kn, at, ts, r0, tr, nrows, k0 > 0, pf);
              break;
            case 2:
              ShrinkTile<2>(buf, kn, at, ts, r0, tr, nrows, k0 > 0, pf);
              break;
#if HWY_TARGET <= HWY_AVX3
            case 3:
              ShrinkTile<3>(buf, kn, at, ts, r0, tr, nrows, k0 > 0, pf);
              break;
            case 4:
              ShrinkTile<4>(buf, kn, at, ts, r0, tr, nrows, k0 > 0, pf);
              break;
#endif
            default:
              break;
          }
        }
      }
    }
  }

  // Expand: items are (column block, row panel), column-block major; inside an item, row tiles
  // outer so that each row of y and out is walked in runs of a whole column block, and the next
  // row tile's y is prefetched while this one is computed.
  void ExpandItem(int64_t g0, int64_t n, int64_t item, float *buf) const {
    const int64_t n_blocks = (n + kMR - 1) / kMR;
    const int64_t n_panels = (n_blocks + kRowPanelTiles - 1) / kRowPanelTiles;
    const int64_t cb = item / n_panels, rp = item % n_panels;
    const int64_t ct_begin = cb * col_block_tiles,
                  ct_end = std::min(n_tiles, ct_begin + col_block_tiles);
    const int64_t blk_end = std::min(n_blocks, (rp + 1) * kRowPanelTiles);
    for (int64_t blk = rp * kRowPanelTiles; blk < blk_end; ++blk) {
      const int nrows = static_cast<int>(std::min<int64_t>(kMR, n - blk * kMR));
      const float *tr[kMR];
      const T *yr[kMR];
      T *outr[kMR];
      for (int m = 0; m < kMR; ++m) {
        const int64_t k = g0 + blk * kMR + (m < nrows ? m : 0);
        const int64_t row = a.rows[k];
        tr[m] = s.t + k * ts;
        yr[m] = y + row * a.y_stride + a.y_offset;
        outr[m] = out + row * a.out_stride + a.y_offset;
      }
      const int64_t next_rows = blk + 1 < blk_end ? std::min<int64_t>(kMR, n - (blk + 1) * kMR) : 0;
      for (int64_t ct = ct_begin; ct < ct_end; ++ct) {
        const int64_t col0 = ct * tw;
        for (int64_t m = 0; m < next_rows; ++m) {
          const T *ny =
              y + static_cast<int64_t>(a.rows[g0 + (blk + 1) * kMR + m]) * a.y_stride + a.y_offset;
          for (int64_t c = col0; c < std::min(h2, col0 + tw);
               c += 64 / static_cast<int64_t>(sizeof(T))) {
            hwy::Prefetch(ny + c);
          }
        }
        ExpandTile(tr, nrows, s.b_panel + ct * R * tw, R, col0, h2, yr, outr, a.scale, buf);
      }
    }
  }

  // ---- decode: items (group, rank chunk) of the shrink, (group, column block) of the expand ----

  // t[k][r] for the group's rows k and ranks r of rank chunk rc: register tiles of kSR rows x kSQ
  // ranks (ShrinkDots, converting x and weightA as it loads them; a partial tile repeats its last
  // row or rank and stores only the real ones).
  void DecodeShrinkItem(int64_t ad, int64_t rc) const {
    const int64_t r_begin = rc * kDecodeRanks;
    const int64_t r_end = std::min(R, r_begin + kDecodeRanks);
    const int64_t g0 = a.group_start[ad], g1 = a.group_start[ad + 1];
    if (!has_a) {
      for (int64_t k = g0; k < g1; ++k) {
        const T *xrow = x + static_cast<int64_t>(a.rows[k]) * a.x_stride;
        ConvertRow(xrow + r_begin, s.t + k * ts + r_begin, r_end - r_begin);
      }
      return;
    }
    const T *A = wa + ad * a.wa_adapter_stride;
    for (int64_t km = g0; km < g1; km += kSR) {
      const int nm = static_cast<int>(std::min<int64_t>(kSR, g1 - km));
      const T *xr[kSR];
      for (int m = 0; m < kSR; ++m) {
        xr[m] = x + static_cast<int64_t>(a.rows[km + std::min(m, nm - 1)]) * a.x_stride;
      }
      for (int64_t rq = r_begin; rq < r_end; rq += kSQ) {
        const int nq = static_cast<int>(std::min<int64_t>(kSQ, r_end - rq));
        const T *ar[kSQ];
        for (int q = 0; q < kSQ; ++q) ar[q] = A + (rq + std::min(q, nq - 1)) * a.wa_row_stride;
        float z[kSR][kSQ];
        ShrinkDots(xr, ar, h1, z);
        for (int m = 0; m < nm; ++m) {
          for (int q = 0; q < nq; ++q) s.t[(km + m) * ts + rq + q] = z[m][q];
        }
      }
    }
  }

  // out columns [cc * kDecodeCols, ...) of the group's rows, from the group's finished t: tiles
  // of up to kDR rows (ExpandRows), or where vectors cannot be transposed in registers, a dot
  // product per output element.
  void DecodeExpandItem(int64_t ad, int64_t cc, float *buf) const {
    const int64_t j_begin = cc * kDecodeCols;
    const int64_t j_end = std::min(h2, j_begin + kDecodeCols);
    const T *B = wb + ad * a.wb_adapter_stride;
    const int64_t g0 = a.group_start[ad], g1 = a.group_start[ad + 1];
    if constexpr (!kTransposes) {
      for (int64_t k = g0; k < g1; ++k) {
        const float *t = s.t + k * ts;
        const int64_t jn = j_end - j_begin;
        for (int64_t j = 0; j < jn; ++j) {
          buf[j] = DotShort(t, B + (j_begin + j) * a.wb_row_stride, R);
        }
        const int64_t row = a.rows[k];
        EpilogueRow(buf, y + row * a.y_stride + a.y_offset + j_begin,
                    out + row * a.out_stride + a.y_offset + j_begin, jn, a.scale);
      }
    } else {
      for (int64_t km = g0; km < g1; km += kDR) {
        ExpandRowsOf<1>(static_cast<int>(std::min<int64_t>(kDR, g1 - km)), B, km, j_begin, j_end,
                        buf);
      }
    }
  }

  // ExpandRows<nm>, for 1 <= nm <= kDR.
  template <int kM>
  void ExpandRowsOf(int nm, const T *B, int64_t km, int64_t j_begin, int64_t j_end,
                    float *buf) const {
    if (nm == kM) return ExpandRows<kM>(B, km, j_begin, j_end, buf);
    if constexpr (kM < kDR) ExpandRowsOf<kM + 1>(nm, B, km, j_begin, j_end, buf);
  }

  // Columns [j_begin, j_end) of the kM rows at sorted positions km ..: per N columns, acc[m] = 0,
  // then per N ranks weightB's [N columns, N ranks] block loaded and transposed in registers
  // (v[r] = the columns' weights of rank r) and acc[m] = t[m][r] * v[r] + acc[m] in r order; then
  // the epilogue. The prefill expand's operations in its order: both paths give the same bits from
  // the same t.
  template <int kM>
  void ExpandRows(const T *B, int64_t km, int64_t j_begin, int64_t j_end, float *buf) const {
    const DF d;
    constexpr size_t kN = hn::MaxLanes(DF());
    float *part = buf;      // one partial rank chunk, zero padded
    float *tail = buf + N;  // a partial column block's sums
    const float *tr[kM];
    const T *yr[kM];
    T *outr[kM];
    for (int m = 0; m < kM; ++m) {
      const int64_t row = a.rows[km + m];
      tr[m] = s.t + (km + m) * ts;
      yr[m] = y + row * a.y_stride + a.y_offset;
      outr[m] = out + row * a.out_stride + a.y_offset;
    }
    const auto vs = hn::Set(d, a.scale);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += N) {
      const int64_t jn = std::min<int64_t>(N, j_end - j0);
      VF acc[kM];
      for (int m = 0; m < kM; ++m) acc[m] = hn::Zero(d);
      for (int64_t r0 = 0; r0 < R; r0 += N) {
        const int64_t rn = std::min<int64_t>(N, R - r0);
        VF v[kN];
        const T *src = B + j0 * a.wb_row_stride + r0;
        const int64_t bs = a.wb_row_stride;
        if (jn == N && rn == N) {  // a whole block
          HWY_UNROLL(16)
          for (size_t c = 0; c < kN; ++c) v[c] = LoadWide(d, src + static_cast<int64_t>(c) * bs);
        } else {
          // Only columns that exist get an address: stepping a pointer by bs past the last column
          // (c >= jn) would leave weightB, and wrap around the address space where H2 = 1 and
          // its unused row stride is huge (undefined behaviour, even unread).
          for (size_t c = 0; c < kN; ++c) {
            if (static_cast<int64_t>(c) >= jn) {
              v[c] = hn::Zero(d);
              continue;
            }
            const T *col = src + static_cast<int64_t>(c) * bs;
            if (rn == N) {
              v[c] = LoadWide(d, col);
            } else {
              for (int64_t i = 0; i < N; ++i) part[i] = i < rn ? to_float(col[i]) : 0.0f;
              v[c] = hn::Load(d, part);
            }
          }
        }
        TransposeSquare<kN>(v);
        HWY_UNROLL(16)
        for (size_t r = 0; r < kN; ++r) {
          if (static_cast<int64_t>(r) >= rn) break;
          for (int m = 0; m < kM; ++m) {
            acc[m] = hn::MulAdd(hn::Set(d, tr[m][r0 + static_cast<int64_t>(r)]), v[r], acc[m]);
          }
        }
      }
      for (int m = 0; m < kM; ++m) {
        if (jn == N) {
          StoreNarrow(d, hn::Add(LoadWide(d, yr[m] + j0), hn::Mul(vs, acc[m])), outr[m] + j0);
        } else {
          hn::Store(acc[m], d, tail);
          for (int64_t jj = 0; jj < jn; ++jj)
            outr[m][j0 + jj] = from_float<T>(to_float(yr[m][j0 + jj]) + a.scale * tail[jj]);
        }
      }
    }
  }
};

// Items [begin, end) of one stage, each instantiation its own function (as tight as the loop
// over one kind of item can be).
template <typename T, AddLoraStage S>
void StageItems(const AddLoraArgs &a, const AddLoraScratch &s, const AddLoraWork &w, int64_t begin,
                int64_t end, float *buf) {
  const Driver<T> drv(a, s);
  const int64_t *list = s.group_list;
  for (int64_t i = begin; i < end; ++i) {
    if constexpr (S == AddLoraStage::kPack) {
      drv.PackItem(w.adapter, i, buf);
    } else if constexpr (S == AddLoraStage::kShrink) {
      drv.ShrinkItem(w.g0, w.n, i, buf);
    } else if constexpr (S == AddLoraStage::kExpand) {
      drv.ExpandItem(w.g0, w.n, i, buf);
    } else if constexpr (S == AddLoraStage::kDecodeGroup) {
      for (int64_t rc = 0; rc < drv.n_rank_chunks; ++rc) drv.DecodeShrinkItem(list[i], rc);
      for (int64_t cc = 0; cc < drv.n_dec_cols; ++cc) drv.DecodeExpandItem(list[i], cc, buf);
    } else if constexpr (S == AddLoraStage::kDecodeShrink) {
      drv.DecodeShrinkItem(list[i / drv.n_rank_chunks], i % drv.n_rank_chunks);
    } else {
      drv.DecodeExpandItem(list[i / drv.n_dec_cols], i % drv.n_dec_cols, buf);
    }
  }
}

template <typename T>
void ItemsTyped(const AddLoraArgs &a, const AddLoraScratch &s, const AddLoraWork &w, int64_t begin,
                int64_t end, float *buf) {
  switch (w.stage) {
    case AddLoraStage::kPack:
      return StageItems<T, AddLoraStage::kPack>(a, s, w, begin, end, buf);
    case AddLoraStage::kShrink:
      return StageItems<T, AddLoraStage::kShrink>(a, s, w, begin, end, buf);
    case AddLoraStage::kExpand:
      return StageItems<T, AddLoraStage::kExpand>(a, s, w, begin, end, buf);
    case AddLoraStage::kDecodeGroup:
      return StageItems<T, AddLoraStage::kDecodeGroup>(a, s, w, begin, end, buf);
    case AddLoraStage::kDecodeShrink:
      return StageItems<T, AddLoraStage::kDecodeShrink>(a, s, w, begin, end, buf);
    case AddLoraStage::kDecodeExpand:
      return StageItems<T, AddLoraStage::kDecodeExpand>(a, s, w, begin, end, buf);
  }
}

}  // namespace lora

AddLoraItemCounts AddLoraCounts(const AddLoraArgs &a, const AddLoraScratch &s, int64_t n) {
  const lora::Driver<float> drv(a, s);  // the counts do not depend on the element type
  const int64_t n_blocks = (n + lora::kMR - 1) / lora::kMR;
  const int64_t n_panels = (n_blocks + lora::kRowPanelTiles - 1) / lora::kRowPanelTiles;
  return {drv.PackAItems() + drv.n_tiles,
          (n_blocks + lora::kShrinkItemBlocks - 1) / lora::kShrinkItemBlocks,
          drv.n_col_blocks * n_panels, drv.n_rank_chunks, drv.n_dec_cols};
}

void AddLoraItems(const AddLoraArgs &a, const AddLoraScratch &s, const AddLoraWork &w,
                  int64_t begin, int64_t end, float *buf) {
  return with_float_type(a.dtype,
                         [&]<class T>() { return lora::ItemsTyped<T>(a, s, w, begin, end, buf); });
}

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(AddLoraCounts);
HWY_EXPORT(AddLoraItems);

AddLoraHwyKernel add_lora_hwy() {
  return {FUSEKIT_HWY_DISPATCH(AddLoraCounts), FUSEKIT_HWY_DISPATCH(AddLoraItems)};
}

}  // namespace fusekit
#endif  // HWY_ONCE
