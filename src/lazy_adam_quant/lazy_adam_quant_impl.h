// fusekit internal: LazyAdamQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
#define FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "common/plan.h"
#include "common/quant_implementations.h"
#include "common/quant_search.h"
#include "fusekit/lazy_adam_quant.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it.
struct LazyAdamQuantOp : OpTypes<LazyAdamQuantProblem, LazyAdamQuantTensors, LazyAdamQuantScalars,
                                 LazyAdamQuantOptions, LazyAdamQuantStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {{"gradient"},     {"indices"},        {"inputM", true},
                                          {"inputV", true}, {"inputVar", true}, {"qmapM"},
                                          {"qmapV"},        {"absmaxM", true},  {"absmaxV", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.gradient, &t.indices, &t.m,        &t.v,       &t.var,
                      &t.qmap_m,   &t.qmap_v,  &t.absmax_m, &t.absmax_v};
  }
  static constexpr const char *kName = "LazyAdamQuant";
  // The list, in order of preference (lazy_adam_quant_implementations.cc).
  static std::span<const Implementation<LazyAdamQuantOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using LazyAdamQuantImpl = Implementation<LazyAdamQuantOp>;

// The CPU implementations, common/quant_implementations.h's list over this operator's CPU run
// (lazy_adam_quant_cpu.cc).
std::span<const LazyAdamQuantImpl *const> lazy_adam_quant_cpu_implementations();

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
