// fusekit internal: what the embedding-bag optimizers (EmbeddingBagLazyAdam on float32 state,
// EmbeddingBagLazyAdamQuant on LazyAdamQuant's 8-bit state) share ahead of their row step,
// written once:
//   plan time   the batch tensors' dtypes and ranks, the pooling mode, grad_output's columns
//               (check_bag_inputs);
//   bind time   the batch's own rules, B and L taken from the run (bag_batch_desc,
//               check_bag_batch);
//   run         the offsets stage (offsets checked; the bag of every lookup, the bags' scales for
//               mean) and LazyAdam's check stage with negative ids refused (bag_front_stages);
//   kernels     the gradient of one table row: the scaled grad_output rows of its lookups summed in
//               order of occurrence (bag_row_gradient_reference here, BagRowGradient in
//               common/bag_gradient_hwy-inl.h for the SIMD kernels).
// Their messages name the operator; the messages are docs/embedding_bag_lazy_adam.md's.
#ifndef FUSEKIT_COMMON_EMBEDDING_BAGS_H_
#define FUSEKIT_COMMON_EMBEDDING_BAGS_H_

#include <cstddef>
#include <cstdint>

#include "common/plan.h"
#include "common/row_groups.h"
#include "common/verbose.h"
#include "fusekit/embedding_bag_lazy_adam.h"  // PoolingMode
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Plan time: grad_output a float32 row table of `dim` columns, indices and offsets int32 or int64
// vectors, per_sample_weights a float32 vector or an empty view (*weighted says which), a pooling
// mode that exists, a table of fewer than 2^32 - 1 rows.
Status check_bag_inputs(const char *op, const TensorView &grad_output, const TensorView &indices,
                        const TensorView &offsets, const TensorView &per_sample_weights,
                        PoolingMode pooling, int64_t rows, int64_t dim, bool *weighted);

// Bind time: the planned descriptions of an embedding-bag operator's tensors with the batch
// dimension (size and stride) of each batch tensor taken from the run, for the generic bound-tensor
// check (Tensors has grad_output, indices, offsets and per_sample_weights).
template <class Tensors>
Tensors bag_batch_desc(Tensors planned, const Tensors &bound) {
  for (auto [e, b] : {std::pair{&planned.grad_output, &bound.grad_output},
                      {&planned.indices, &bound.indices},
                      {&planned.offsets, &bound.offsets},
                      {&planned.per_sample_weights, &bound.per_sample_weights}}) {
    if (e->ndim >= 1 && b->ndim == e->ndim) {
      e->shape[0] = b->shape[0];
      e->strides[0] = b->strides[0];
    }
  }
  return planned;
}

// The plan classes' workspace_size(bags, lookups): the workspace of a run on a batch of `bags` bags
// and `lookups` lookups (the plan's tensors with those batch sizes).
template <class Op>
size_t bag_batch_workspace_bytes(const PlanStateOf<Op> &s, int64_t bags, int64_t lookups) {
  typename Op::Tensors t = s.problem.desc;
  t.grad_output.shape[0] = bags;
  t.indices.shape[0] = lookups;
  t.offsets.shape[0] = bags + 1;
  if (s.problem.weighted) t.per_sample_weights.shape[0] = lookups;
  return run_workspace_bytes<Op>(s, t);
}

// Bind time: the batch's own rules (offsets B + 1 entries, per_sample_weights L, sizes within
// 2^32 - 1, strides that can be walked).
Status check_bag_batch(const char *op, const TensorView &grad_output, const TensorView &indices,
                       const TensorView &offsets, const TensorView &per_sample_weights,
                       bool weighted);

// The front of the workspace: the check and group stages' part, then the bag of each lookup
// (L uint32) and, for mean, the bags' scales (B floats). `end` (a multiple of 64) is where the
// operator's own part starts.
struct BagLayout {
  RowGroupsLayout groups;
  size_t bag_of = 0, bag_scale = 0, end = 0;
};
BagLayout bag_layout(int64_t bags, int64_t lookups, int64_t rows, bool mean, int threads);

// Whether a batch needs no workspace (no lookups), or more than 32-bit numbering allows (the
// binding refuses it; the workspace size is then SIZE_MAX).
inline bool bag_batch_is_empty(int64_t bags, int64_t lookups) {
  return bags < 0 || lookups <= 0;
}
inline bool bag_batch_too_large(int64_t bags, int64_t lookups) {
  constexpr auto kMax = int64_t{1} << 32;
  return bags >= kMax || lookups >= kMax;
}

// The gradient of a table row, as the kernels see it: grad_output's rows, the bag of each lookup,
// the coefficients c_i = s_b * w_i.
struct BagGradientArgs {
  const float *grad_output;  // [B, D]
  int64_t grad_stride;       // elements between its rows
  const uint32_t *bag_of;    // [L]: the bag of each lookup; null: the entries hold the bags
  const float *bag_scale;    // [B]: s_b = 1 / float32(len_b) (mean); null for sum (s_b = 1)
  const float *weights;      // [L]: per-sample weights; null when unweighted (w_i = 1); only
                             // with bag_of (a weight is per lookup)
  int64_t weight_stride;
  // The bag of the lookup an entry names (its low 32 bits: the lookup, or the bag itself).
  uint32_t bag(uint64_t entry) const {
    const auto low = static_cast<uint32_t>(entry & 0xffffffffu);
    return bag_of != nullptr ? bag_of[low] : low;
  }
  bool scaled() const { return bag_scale != nullptr || weights != nullptr; }
};

// The run's front stages, in order, nothing written to the tables:
//   offsets  offsets[0] = 0, non-decreasing, offsets[B] = L, else refused naming the first bad
//            one; then the bag of each lookup and, for mean, each bag's 1 / float32(len);
//   check    LazyAdam's pass over the ids (common/row_groups.h), an id < 0 or >= R refused naming
//            the first bad position.
// On success *e holds the entries (row << 32 | lookup) in batch order (e->end = 0 for a batch
// without lookups, after the offsets were checked) and *bags_out the gradient's description.
Status bag_front_stages(const char *op, const TensorView &grad_output, const TensorView &indices,
                        const TensorView &offsets, const TensorView &per_sample_weights,
                        bool weighted, bool mean, int64_t rows, char *workspace,
                        const BagLayout &layout, int threads, RowEntries *e,
                        BagGradientArgs *bags_out, StageTimer &timer);

// After the check stage, unweighted: a lookup's bag is all the update needs of it, so the entries
// carry the bag instead of the lookup (row << 32 | bag, one sequential pass; no bag_of[i] read per
// lookup in the update, where the lookups come in row order) and bags->bag_of becomes null.
// Weighted tables keep the lookups (a weight is per lookup).
void bag_entries_hold_bags(const RowEntries &e, int64_t lookups, int threads,
                           BagGradientArgs *bags);

// The group stage of the embedding-bag optimizers: LazyAdam's, in row order (GroupOrder::kRow:
// their gradient rows, the bags', are few and stay in cache, so the table is walked by address).
inline void bag_group_stage(int64_t rows, char *workspace, const BagLayout &layout, int threads,
                            RowEntries *e, StageTimer &timer) {
  row_groups_group(rows, workspace, layout.groups, threads, e, timer, GroupOrder::kRow);
}

// The gradient of the row whose group of entries starts at k (entries (row << 32 | lookup or
// bag), a row's lookups neighbours in order of occurrence): g = x_i1, then g = g + x_i2, ..., with
// x_i = grad_output[b_i] * c_i (or the row itself when unscaled), into g[0, dim). Returns the end
// of the group. The plain scalar form; common/bag_gradient_hwy-inl.h's BagRowGradient is the same
// operations on vectors.
int64_t bag_row_gradient_reference(const BagGradientArgs &a, const uint64_t *entries, int64_t k,
                                   int64_t end, int64_t dim, float *g);

// The same, Highway SIMD, for the best instruction set of this CPU (common/bag_gradient_hwy.cc;
// looked up on each call so that tests can switch targets).
using BagRowGradientFn = int64_t (*)(const BagGradientArgs &a, const uint64_t *entries, int64_t k,
                                     int64_t end, int64_t dim, float *g);
BagRowGradientFn bag_row_gradient_hwy();

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_EMBEDDING_BAGS_H_
