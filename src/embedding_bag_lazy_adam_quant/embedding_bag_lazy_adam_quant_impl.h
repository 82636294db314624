// fusekit internal: EmbeddingBagLazyAdamQuant's description (the seam between the plan and the
// kernels).
#ifndef FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_EMBEDDING_BAG_LAZY_ADAM_QUANT_IMPL_H_
#define FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_EMBEDDING_BAG_LAZY_ADAM_QUANT_IMPL_H_

#include <array>
#include <span>
#include <string>

#include "common/plan.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it. No aclnn face (CANN has no such
// operator): its roles are named as the C++ and Python faces name them.
struct EmbeddingBagLazyAdamQuantOp
    : OpTypes<EmbeddingBagLazyAdamQuantProblem, EmbeddingBagLazyAdamQuantTensors,
              EmbeddingBagLazyAdamQuantScalars, EmbeddingBagLazyAdamQuantOptions,
              EmbeddingBagLazyAdamQuantStats> {
  static constexpr TensorRole kRoles[] = {{"grad_output"},
                                          {"indices"},
                                          {"offsets", false, /*read_when_empty=*/true},
                                          {"per_sample_weights", false, false, /*optional=*/true},
                                          {"m", true},
                                          {"v", true},
                                          {"var", true},
                                          {"qmap_m"},
                                          {"qmap_v"},
                                          {"absmax_m", true},
                                          {"absmax_v", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.grad_output, &t.indices,  &t.offsets, &t.per_sample_weights,
                      &t.m,           &t.v,        &t.var,     &t.qmap_m,
                      &t.qmap_v,      &t.absmax_m, &t.absmax_v};
  }
  static constexpr const char *kName = "EmbeddingBagLazyAdamQuant";
  static std::span<const Implementation<EmbeddingBagLazyAdamQuantOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using EmbeddingBagLazyAdamQuantImpl = Implementation<EmbeddingBagLazyAdamQuantOp>;

// The CPU implementations: common/quant_implementations.h's list (LazyAdamQuant's kernels) over
// this operator's CPU run (embedding_bag_lazy_adam_quant_cpu.cc).
std::span<const EmbeddingBagLazyAdamQuantImpl *const>
embedding_bag_lazy_adam_quant_cpu_implementations();

}  // namespace fusekit

#endif  // FUSEKIT_EMBEDDING_BAG_LAZY_ADAM_QUANT_EMBEDDING_BAG_LAZY_ADAM_QUANT_IMPL_H_
