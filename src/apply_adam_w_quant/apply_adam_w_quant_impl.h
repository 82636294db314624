// fusekit internal: ApplyAdamWQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/plan.h"
#include "common/quant_implementations.h"
#include "common/quant_search.h"
#include "fusekit/apply_adam_w_quant.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it.
struct ApplyAdamWQuantOp
    : OpTypes<ApplyAdamWQuantProblem, ApplyAdamWQuantTensors, ApplyAdamWQuantScalars,
              ApplyAdamWQuantOptions, ApplyAdamWQuantStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {
      {"varRef", true}, {"grad"},  {"mRef", true},       {"vRef", true},
      {"qmapM"},        {"qmapV"}, {"absmaxMRef", true}, {"absmaxVRef", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.var, &t.grad, &t.m, &t.v, &t.qmap_m, &t.qmap_v, &t.absmax_m, &t.absmax_v};
  }
  static constexpr const char *kName = "ApplyAdamWQuant";
  // The list, in order of preference (apply_adam_w_quant_implementations.cc).
  static std::span<const Implementation<ApplyAdamWQuantOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using ApplyAdamWQuantImpl = Implementation<ApplyAdamWQuantOp>;

// The CPU implementations, common/quant_implementations.h's list over this operator's CPU run
// (apply_adam_w_quant_cpu.cc).
std::span<const ApplyAdamWQuantImpl *const> apply_adam_w_quant_cpu_implementations();

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
