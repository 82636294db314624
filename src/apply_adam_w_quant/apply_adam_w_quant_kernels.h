// fusekit internal: ApplyAdamWQuant's kernels. A kernel is a pure function: it neither allocates
// nor reports errors; the implementation's run has checked everything (shapes, maps, step) before
// it runs. The Adam update itself is common/adam_update.h (shared with AdamW); the nearest-code
// search tables are common/quant_search.h (shared with LazyAdamQuant).
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/adam_update.h"
#include "common/quant_search.h"
#include "fusekit/dtype.h"
#include "fusekit/quant_map.h"  // QuantStateFormat

namespace fusekit {

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
  // The lost-v guard (docs/fp8_state.md): a decoded v of 0 beside a decoded m that is not 0 is
  // taken as m * m before the update.
  bool guard_lost_v = false;
  QuantMapTables map_m, map_v;  // the dynamic-map format's maps (unused by the FP8 kernels)
  // Tables a kernel derives from map_m and map_v once per run (the AVX-512 VBMI kernel's register
  // tables: adam_w_quant_avx512vbmi().prepare), or null: the kernel derives them on each call.
  const void *prepared = nullptr;
};

// Updates blocks [begin, end). Returns the number of blocks skipped: left unchanged because a new
// m, v or var (as stored) would be NaN or Inf (common/adam_update.h; a NaN or Inf gradient is one
// case).
using AdamWQuantBlocksFn = int64_t (*)(const AdamWQuantArgs &args, int64_t begin, int64_t end);

// The plain scalar kernel (apply_adam_w_quant_reference.cc), dynamic-map format.
int64_t adam_w_quant_blocks_reference(const AdamWQuantArgs &args, int64_t begin, int64_t end);
// The same in the FP8 state formats (docs/fp8_state.md): absmax_m and absmax_v hold the scales;
// sqrt(v) as UE4M4 (fp8) or as UE3M5 (fp8_ue3m5).
int64_t adam_w_quant_fp8_blocks_reference(const AdamWQuantArgs &args, int64_t begin, int64_t end);
int64_t adam_w_quant_fp8_ue3m5_blocks_reference(const AdamWQuantArgs &args, int64_t begin,
                                                int64_t end);

// The generic Highway kernel (apply_adam_w_quant_hwy.cc), dispatched to the best target Highway
// built that this CPU runs; it reads the lookup tables when they are built (else it searches by 8
// branch-free steps).
AdamWQuantBlocksFn adam_w_quant_blocks_hwy();
// The generic Highway kernel of an FP8 state format (kFp8 or kFp8Ue3m5; apply_adam_w_quant_hwy.cc):
// codes by bit arithmetic (common/fp8_codes_hwy-inl.h).
AdamWQuantBlocksFn adam_w_quant_fp8_blocks_hwy(QuantStateFormat format);

// The AVX-512 VBMI kernel (apply_adam_w_quant_avx512vbmi.cc): the maps and the search tables in
// registers, no gathers; reads no lookup table. Its register tables, built once per run into
// kAdamWQuantPreparedBytes (64-aligned), are passed as AdamWQuantArgs::prepared.
inline constexpr size_t kAdamWQuantPreparedBytes = kQuantVbmiTablesBytes;
QuantVbmiKernel<AdamWQuantBlocksFn> adam_w_quant_avx512vbmi();

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_KERNELS_H_
