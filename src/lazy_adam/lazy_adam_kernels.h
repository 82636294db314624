// fusekit internal: LazyAdam's kernels. A kernel is a pure function: it neither allocates nor
// reports errors; the plan has checked everything before it runs.
#ifndef FUSEKIT_LAZY_ADAM_LAZY_ADAM_KERNELS_H_
#define FUSEKIT_LAZY_ADAM_LAZY_ADAM_KERNELS_H_

#include <cstdint>

namespace fusekit {

struct LazyAdamRowsArgs {
  const float *grad;
  int64_t grad_stride;  // elements between gradient rows
  float *m;
  int64_t m_stride;
  float *v;
  int64_t v_stride;
  float *var;
  int64_t var_stride;
  int64_t dim;
  float beta1, beta2, one_minus_beta1, one_minus_beta2, epsilon, neg_lr;
  // (row << 32 | position) per index. Entries of one row are neighbours, in order of occurrence
  // (the plan sorts when a row is named twice); entries with row >= row_limit are padding.
  const uint64_t *entries;
  uint64_t row_limit;
  // How many entries ahead the optimized kernel prefetches rows (the plan picks it from D).
  int64_t prefetch_ahead;
};

// Updates the rows named by entries[begin, end), where begin and end are boundaries between rows.
// `scratch` holds dim floats (the sum of a duplicated row's gradients). Returns the number of rows
// skipped because their summed gradient is not finite.
using LazyAdamRowsFn = int64_t (*)(const LazyAdamRowsArgs &args, int64_t begin, int64_t end,
                                   float *scratch);

// The plain scalar kernel: the fallback and the test oracle's twin.
int64_t lazy_adam_rows_reference(const LazyAdamRowsArgs &args, int64_t begin, int64_t end,
                                 float *scratch);

// The Highway kernel for the best instruction set of this CPU (chosen once, at first call).
LazyAdamRowsFn lazy_adam_rows_optimized();

// Tests only: plans made after this use the duplicate bitmap up to `bytes` (default 64 MiB, or 8
// bytes per index if more); a negative value disables it, so every batch is grouped by sorting.
void set_lazy_adam_bitmap_limit_for_testing(int64_t bytes);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_LAZY_ADAM_KERNELS_H_
