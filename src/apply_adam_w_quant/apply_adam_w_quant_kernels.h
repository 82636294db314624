// fusekit internal: ApplyAdamWQuant's kernels and the nearest-code search tables. A kernel is a
// pure function: it neither allocates nor reports errors; the implementation's run has checked
// everything (shapes, maps, step) before it runs. The Adam update itself is common/adam_update.h
// (shared with AdamW).
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/adam_update.h"
#include "fusekit/dtype.h"

namespace fusekit {

// ---------------------------------------------------------------------------------------------
// Nearest-code search. For an ascending map q[0..255] with K distinct values u_0 < ... < u_{K-1}
// (u_k first found at index first[k]), the code of a normalized value x is the entry nearest to x
// with ties to the lower index, where "nearer" is decided in float32 between the two values that
// bracket x: the upper one u_{k+1} wins iff fl(u_{k+1} - x) < fl(x - u_k). That choice is monotone
// in x, so it is one threshold per pair: thr[k] is the smallest float for which u_{k+1} wins, and
//   code(x) = first[#{k : thr[k] <= x}]          (a NaN x is taken as 0)
// thr[K-1 .. 255] hold NaN, which no comparison passes. The optimized kernel uses a table over
// buckets of floats (key(x) >> 16, key: the float's bits made monotone, -0 taken as +0):
//  - packed (when no bucket holds two thresholds and the sign fix cannot act, as with the dynamic
//    and linspace maps): one 32-bit entry per bucket = code below | code above << 8 | the low 16
//    key bits of the bucket's threshold << 16 (0 when it has none); one lookup, one comparison;
//  - else lut[bucket] is the count at the bucket's lowest float and `refine_steps` comparisons
//    with the next thresholds finish it.
// ---------------------------------------------------------------------------------------------
inline constexpr int kLutBuckets = 1 << 16;

struct QuantMapTables {
  const float *q = nullptr;          // the map, 256 floats
  const float *thr = nullptr;        // 256 floats (NaN from K - 1 on)
  const int32_t *first = nullptr;    // 256: the code of count c
  const uint32_t *packed = nullptr;  // kLutBuckets entries, or null
  const uint8_t *lut =
      nullptr;           // kLutBuckets + 4 bytes, or null (then, without packed: binary search)
  int distinct = 0;      // K
  int refine_steps = 0;  // comparisons after the table lookup
  bool identity_first = true;  // first[c] == c (no repeated values)
  bool sign_fix = false;       // the sign fix can change a code (signed m maps only)
};

// Bytes of one map's tables (aligned to 64), with or without the lookup table.
size_t quant_tables_bytes(bool with_lut);
// Bytes of the search part alone (q, thr, first), at the start of the tables.
inline constexpr size_t kQuantSearchBytes = 3072;
// Bytes of the lookup part alone (packed or count table), after the search part.
size_t quant_lut_bytes();
// Builds one map's tables in `mem` (quant_tables_bytes(with_lut) bytes, 64-aligned). `q` holds 256
// ascending finite floats; `q_stride` is in elements. `for_m`: the sign fix applies if the map
// holds negative values. The same as build_quant_search then, with_lut, build_quant_lut on
// mem + kQuantSearchBytes.
void build_quant_tables(const float *q, int64_t q_stride, bool for_m, bool with_lut, void *mem,
                        QuantMapTables *out);
// The search part (q, thr, first and the flags) in `mem` (kQuantSearchBytes, 64-aligned); no
// lookup table.
void build_quant_search(const float *q, int64_t q_stride, bool for_m, void *mem,
                        QuantMapTables *out);
// The lookup table of built search tables `t` in `mem` (quant_lut_bytes(), 64-aligned): sets
// t->packed or t->lut (and t->refine_steps).
void build_quant_lut(QuantMapTables *t, void *mem);

// The monotone key of a float: the order of keys is the order of the floats (-0 just below +0).
inline uint32_t float_key(uint32_t bits) {
  return bits ^ ((bits >> 31) != 0 ? 0xffffffffu : 0x80000000u);
}
inline uint32_t key_to_bits(uint32_t key) {
  return key ^ ((key >> 31) != 0 ? 0x80000000u : 0xffffffffu);
}

// ---------------------------------------------------------------------------------------------
// ApplyAdamWQuant: blocks of 256 over contiguous var, grad, m, v.
// ---------------------------------------------------------------------------------------------
struct AdamWQuantArgs : AdamScalars {
  void *var;         // float, float16_t or bfloat16_t (dtype)
  const void *grad;  // same type
  uint8_t *m;
  uint8_t *v;
  float *absmax_m;
  int64_t absmax_m_stride;
  float *absmax_v;
  int64_t absmax_v_stride;
  int64_t n;  // elements from var[0]; block b covers [256 b, min(n, 256 (b + 1)))
  DType dtype;
  QuantMapTables map_m, map_v;
  // Tables a kernel derives from map_m and map_v once per run (the AVX-512 VBMI kernel's register
  // tables: adam_w_quant_prepare_avx512vbmi), or null: the kernel derives them on each call.
  const void *prepared = nullptr;
};

// Updates blocks [begin, end). Returns the number of blocks skipped: left unchanged because a new
// m, v or var (as stored) would be NaN or Inf (common/adam_update.h; a NaN or Inf gradient is one
// case).
using AdamWQuantBlocksFn = int64_t (*)(const AdamWQuantArgs &args, int64_t begin, int64_t end);

// The plain scalar kernel (apply_adam_w_quant_reference.cc).
int64_t adam_w_quant_blocks_reference(const AdamWQuantArgs &args, int64_t begin, int64_t end);

// The generic Highway kernel (apply_adam_w_quant_hwy.cc), dispatched to the best target Highway
// built that this CPU runs; it reads the lookup tables when they are built (else it searches by 8
// branch-free steps).
AdamWQuantBlocksFn adam_w_quant_blocks_hwy();
const char *adam_w_quant_hwy_target();

// The AVX-512 VBMI kernel (apply_adam_w_quant_avx512vbmi.cc): the maps and the search tables in
// registers, no gathers; reads no lookup table. Null when the library was built without an AVX-512
// target; call it only where adam_w_quant_avx512vbmi_why_not() is null.
AdamWQuantBlocksFn adam_w_quant_blocks_avx512vbmi();
// Null when this CPU runs the VBMI kernel, else why not.
const char *adam_w_quant_avx512vbmi_why_not();
// Its register tables for two maps' search tables, built once per run into `out`
// (kAdamWQuantPreparedBytes, 64-aligned) and passed as AdamWQuantArgs::prepared.
inline constexpr size_t kAdamWQuantPreparedBytes = 12288;
void adam_w_quant_prepare_avx512vbmi(const QuantMapTables &m, const QuantMapTables &v, void *out);

// The reference search (also used to build the table): #{k : thr[k] <= x} over K - 1 thresholds.
int quant_count_reference(const QuantMapTables &t, float x);
// The full code of x, sign fix included (for m tables with sign_fix).
uint8_t quant_code_reference(const QuantMapTables &t, float x);

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
