// fusekit internal: LazyAdamQuant's row kernels. A kernel is a pure function: it neither allocates
// nor reports errors; the implementation's run has checked everything (shapes, maps, indices, lr)
// before it runs. The search tables it reads are common/quant_search.h (ApplyAdamWQuant's).
#ifndef FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_KERNELS_H_
#define FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "common/quant_search.h"
#include "fusekit/dtype.h"

namespace fusekit {

inline constexpr int64_t kLaqBlock = 256;  // columns per absmax block of a row

struct LazyAdamQuantRowsArgs {
  const void *grad;     // grad_dtype: float32 or var's dtype
  int64_t grad_stride;  // elements between gradient rows
  DType grad_dtype;
  void *var;  // dtype: float32, bfloat16 or float16
  int64_t var_stride;
  DType dtype;
  uint8_t *m;
  int64_t m_stride;
  uint8_t *v;
  int64_t v_stride;
  float *absmax_m;
  int64_t absmax_m_stride;  // elements between rows (blocks of a row are contiguous)
  float *absmax_v;
  int64_t absmax_v_stride;
  int64_t dim;     // D >= 1
  int64_t blocks;  // ceil(D / 256)
  float beta1, beta2, one_minus_beta1, one_minus_beta2, epsilon, neg_lr;
  // The lost-v guard (docs/fp8_state.md): a decoded v of 0 beside a decoded m that is not 0 is
  // taken as m * m before the update.
  bool guard_lost_v = false;
  QuantMapTables map_m, map_v;  // the dynamic-map format's maps (unused by the FP8 kernels)
  // The AVX-512 VBMI kernel's register tables (kQuantVbmiTablesBytes), built once per run, or null.
  const void *prepared = nullptr;
  // (row << 32 | position) per index. Entries of one row are neighbours, in order of occurrence;
  // entries with row >= row_limit are padding (common/row_groups.h).
  const uint64_t *entries;
  uint64_t row_limit;
  // How many entries ahead the optimized kernels prefetch rows (the implementation picks it from
  // D and the dtypes).
  int64_t prefetch_ahead;
};

// The end of the group of entries that starts at k: the first entry of another row, or `end`.
inline int64_t laq_group_end(const LazyAdamQuantRowsArgs &a, int64_t k, int64_t end) {
  const uint64_t row = a.entries[k] >> 32;
  int64_t next = k + 1;
  while (next < end && (a.entries[next] >> 32) == row) ++next;
  return next;
}

// The rows of table row r: var (of dtype T), the codes of m and v, their block maxima.
template <typename T>
struct LaqRow {
  T *var;
  uint8_t *m, *v;
  float *absmax_m, *absmax_v;
};
template <typename T>
LaqRow<T> laq_row(const LazyAdamQuantRowsArgs &a, int64_t r) {
  return {static_cast<T *>(a.var) + r * a.var_stride, a.m + r * a.m_stride, a.v + r * a.v_stride,
          a.absmax_m + r * a.absmax_m_stride, a.absmax_v + r * a.absmax_v_stride};
}

// Per-thread scratch of a kernel call (64-aligned): the summed (or widened) gradient row g and the
// new m, v and var (w) of one row, each D floats rounded up to 16 and 16 more (a SIMD kernel
// stores whole vectors), then the row's block maxima of m and v (`blocks` floats each).
struct LaqScratch {
  float *g, *m, *v, *w, *max_m, *max_v;
};
inline size_t laq_scratch_row_bytes(int64_t dim) {
  return static_cast<size_t>(((dim + 15) / 16 * 16 + 16) * 4 + 63) / 64 * 64;
}
inline size_t laq_scratch_max_bytes(int64_t dim) {
  const auto blocks = static_cast<size_t>((dim + kLaqBlock - 1) / kLaqBlock);
  return (blocks * 4 + 63) / 64 * 64;
}
inline size_t lazy_adam_quant_scratch_bytes(int64_t dim) {
  return 4 * laq_scratch_row_bytes(dim) + 2 * laq_scratch_max_bytes(dim);
}
inline LaqScratch laq_scratch(void *p, int64_t dim) {
  auto *b = static_cast<char *>(p);
  const size_t row = laq_scratch_row_bytes(dim), mx = laq_scratch_max_bytes(dim);
  return {reinterpret_cast<float *>(b),           reinterpret_cast<float *>(b + row),
          reinterpret_cast<float *>(b + 2 * row), reinterpret_cast<float *>(b + 3 * row),
          reinterpret_cast<float *>(b + 4 * row), reinterpret_cast<float *>(b + 4 * row + mx)};
}

// Updates the rows named by entries[begin, end), where begin and end are boundaries between rows.
// Returns the number of rows left unchanged because a new m, v or var (as stored) would be NaN or
// Inf in some column.
using LazyAdamQuantRowsFn = int64_t (*)(const LazyAdamQuantRowsArgs &args, int64_t begin,
                                        int64_t end, void *scratch);

// The plain scalar kernel: the fallback and the test oracle's twin.
int64_t lazy_adam_quant_rows_reference(const LazyAdamQuantRowsArgs &args, int64_t begin,
                                       int64_t end, void *scratch);
// The same in the FP8 state format (docs/fp8_state.md): absmax_m and absmax_v hold the scales.
int64_t lazy_adam_quant_fp8_rows_reference(const LazyAdamQuantRowsArgs &args, int64_t begin,
                                           int64_t end, void *scratch);

// The Highway kernel for the best instruction set of this CPU (chosen at each call, so that tests
// can switch targets); it reads the lookup tables when they are built (else 8 branch-free steps).
LazyAdamQuantRowsFn lazy_adam_quant_rows_hwy();
// The Highway kernel of the FP8 state format: codes by bit arithmetic.
LazyAdamQuantRowsFn lazy_adam_quant_fp8_rows_hwy();

// The AVX-512 VBMI kernel (lazy_adam_quant_avx512vbmi.cc): maps and searches in registers; its
// register tables are passed as `prepared`.
QuantVbmiKernel<LazyAdamQuantRowsFn> lazy_adam_quant_avx512vbmi();

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_KERNELS_H_
