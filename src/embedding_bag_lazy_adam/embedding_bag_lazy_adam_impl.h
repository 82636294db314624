// fusekit internal: EmbeddingBagLazyAdam's description (the seam between the plan and the
// kernels).
#ifndef FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_IMPL_H_
#define FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "common/plan.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_kernels.h"
#include "fusekit/embedding_bag_lazy_adam.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it. It has no aclnn face (CANN has no such
// operator): its roles are named as the C++ and Python faces name them.
struct EmbeddingBagLazyAdamOp
    : OpTypes<EmbeddingBagLazyAdamProblem, EmbeddingBagLazyAdamTensors, EmbeddingBagLazyAdamScalars,
              EmbeddingBagLazyAdamOptions, EmbeddingBagLazyAdamStats> {
  static constexpr TensorRole kRoles[] = {{"grad_output"},
                                          {"indices"},
                                          {"offsets", false, /*read_when_empty=*/true},
                                          {"per_sample_weights", false, false, /*optional=*/true},
                                          {"m", true},
                                          {"v", true},
                                          {"var", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.grad_output, &t.indices, &t.offsets, &t.per_sample_weights,
                      &t.m,           &t.v,       &t.var};
  }
  static constexpr const char *kName = "EmbeddingBagLazyAdam";
  static std::span<const Implementation<EmbeddingBagLazyAdamOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using EmbeddingBagLazyAdamImpl = Implementation<EmbeddingBagLazyAdamOp>;

// The CPU implementations' workspace for a run on `t` (B bags, L lookups): the row groups' part,
// the bag of each lookup, the bags' scales (mean), one gradient row of scratch per thread.
size_t embedding_bag_lazy_adam_cpu_run_workspace_bytes(const EmbeddingBagLazyAdamProblem &p,
                                                       const EmbeddingBagLazyAdamTensors &t,
                                                       int threads);
// The CPU run: lr, then the stages offsets, check, group, update, with the row kernel of the
// implementation.
Status embedding_bag_lazy_adam_cpu_run(EmbeddingBagLazyAdamRowsFn kernel, int64_t prefetch_ahead,
                                       const EmbeddingBagLazyAdamProblem &p,
                                       const EmbeddingBagLazyAdamTensors &t,
                                       const EmbeddingBagLazyAdamScalars &s, const RunContext &ctx,
                                       EmbeddingBagLazyAdamStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_EMBEDDING_BAG_LAZY_ADAM_IMPL_H_
