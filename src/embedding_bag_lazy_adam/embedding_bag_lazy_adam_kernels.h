// fusekit internal: EmbeddingBagLazyAdam's kernels. A kernel is a pure function: it neither
// allocates nor reports errors; the run has checked everything (offsets, indices, lr) before it
// runs.
#ifndef FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_KERNELS_H_
#define FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_KERNELS_H_

#include <cstdint>

#include "common/embedding_bags.h"

namespace fusekit {

struct EmbeddingBagLazyAdamRowsArgs {
  BagGradientArgs bags;  // grad_output, the bag of each lookup, the coefficients
  float *m;
  int64_t m_stride;
  float *v;
  int64_t v_stride;
  float *var;
  int64_t var_stride;
  int64_t dim;
  float beta1, beta2, one_minus_beta1, one_minus_beta2, epsilon, neg_lr;
  // (row << 32 | lookup i) per lookup, or (row << 32 | bag of i) when bags.bag_of is null; the
  // lookups of one row are neighbours, in order of occurrence (common/row_groups.h). Every row is
  // < row_limit (negative ids were refused).
  const uint64_t *entries;
  uint64_t row_limit;
  int64_t prefetch_ahead;  // entries ahead whose rows the optimized kernel prefetches
};

// Updates the rows named by entries[begin, end), where begin and end are boundaries between rows.
// `scratch` holds dim floats (the row's gradient g). Returns the rows skipped because g is not
// finite.
using EmbeddingBagLazyAdamRowsFn = int64_t (*)(const EmbeddingBagLazyAdamRowsArgs &args,
                                               int64_t begin, int64_t end, float *scratch);

// The plain scalar kernel: the fallback and the test oracle's twin.
int64_t embedding_bag_lazy_adam_rows_reference(const EmbeddingBagLazyAdamRowsArgs &args,
                                               int64_t begin, int64_t end, float *scratch);

// The Highway kernel for the best instruction set of this CPU (looked up on each call).
EmbeddingBagLazyAdamRowsFn embedding_bag_lazy_adam_rows_optimized();

}  // namespace fusekit

#endif  // FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_KERNELS_H_
