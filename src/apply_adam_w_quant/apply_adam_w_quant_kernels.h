// fusekit internal: ApplyAdamWQuant's and AdamW's kernels and the nearest-code search tables. A
// kernel is a pure function: it neither allocates nor reports errors; the plan has checked
// everything (shapes, maps, step) before it runs.
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fusekit/dtype.h"
#include "fusekit/export.h"

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
FUSEKIT_API size_t quant_tables_bytes(bool with_lut);  // exported for the tests
// Builds one map's tables in `mem` (quant_tables_bytes(with_lut) bytes, 64-aligned). `q` holds 256
// ascending finite floats; `q_stride` is in elements. `for_m`: the sign fix applies if the map
// holds negative values.
FUSEKIT_API void build_quant_tables(const float *q, int64_t q_stride, bool for_m, bool with_lut,
                                    void *mem, QuantMapTables *out);

// The monotone key of a float: the order of keys is the order of the floats (-0 just below +0).
inline uint32_t float_key(uint32_t bits) {
  return bits ^ ((bits >> 31) != 0 ? 0xffffffffu : 0x80000000u);
}
inline uint32_t key_to_bits(uint32_t key) {
  return key ^ ((key >> 31) != 0 ? 0x80000000u : 0xffffffffu);
}

// ---------------------------------------------------------------------------------------------
// The Adam(W) update both operators share, with its scalars derived per step in float32 as CANN's
// kernel does (t = step + 1; the plan computes them).
// ---------------------------------------------------------------------------------------------
struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, gnorm_scale, step_size, eps_c2s, decay;
  bool apply_decay;  // weight decay > 0
};

// One element: m and v (dequantized, or the float32 moments) updated in place; returns the new
// var. The float32 operations in the order of every kernel and of the NumPy golden; the project
// builds with -ffp-contract=off, so none is fused.
inline float adam_update(const AdamScalars &s, float grad, float *m, float *v, float w) {
  const float g = grad * s.gnorm_scale;
  *m = *m * s.beta1 + g * s.one_minus_beta1;
  *v = *v * s.beta2 + (g * g) * s.one_minus_beta2;
  w = w + (*m * s.step_size) / (std::sqrt(*v) + s.eps_c2s);
  return s.apply_decay ? w * s.decay : w;
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
};

// Updates blocks [begin, end). Returns the number of blocks skipped (non-finite gradient).
using AdamWQuantBlocksFn = int64_t (*)(const AdamWQuantArgs &args, int64_t begin, int64_t end);

int64_t adam_w_quant_blocks_reference(const AdamWQuantArgs &args, int64_t begin, int64_t end);
AdamWQuantBlocksFn adam_w_quant_blocks_optimized();
FUSEKIT_API const char *adam_w_quant_optimized_target();
// Whether the optimized kernel, as dispatched now, reads the lookup tables (packed or count table);
// the AVX-512 VBMI kernel does not, so phase two need not build them for it.
bool adam_w_quant_optimized_uses_tables();

// The reference search (also used to build the table): #{k : thr[k] <= x} over K - 1 thresholds.
int quant_count_reference(const QuantMapTables &t, float x);
// The full code of x, sign fix included (for m tables with sign_fix).
FUSEKIT_API uint8_t quant_code_reference(const QuantMapTables &t, float x);

// ---------------------------------------------------------------------------------------------
// AdamW on float32 moments: elements [begin, end).
// ---------------------------------------------------------------------------------------------
struct AdamWArgs : AdamScalars {
  void *var;
  const void *grad;
  float *m;
  float *v;
  DType dtype;
};

// Returns the number of elements skipped (non-finite gradient).
using AdamWElementsFn = int64_t (*)(const AdamWArgs &args, int64_t begin, int64_t end);

int64_t adam_w_elements_reference(const AdamWArgs &args, int64_t begin, int64_t end);
AdamWElementsFn adam_w_elements_optimized();

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
